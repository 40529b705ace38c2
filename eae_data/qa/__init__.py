"""Closed-book QA data: question files -> `QAExample`s, answer strings -> entity ids, and exact
match.

    examples.load_dataset("synth:DIR" | "fanoutqa[:FILE]" | "triviaqa:TRAIN,DEV[,TEST]" |
                          "webquestions:TRAIN[,DEV],TEST") -> {split: [QAExample]}
    resolve.AnswerResolver(vocab_dir).resolve(answers) -> entity id | None

The model side (questions -> batches with an answer-position mention) is `eae_model.qa.encode`.
"""
