"""Closed-book question answering as entity prediction (paper section "Open domain Question
Answering"): question files -> `QAExample`s, answer strings -> entity ids, questions ->
model batches with an answer-position mention, and exact match.

    examples.load_dataset("synth:DIR" | "fanoutqa[:FILE]" | "triviaqa:TRAIN,DEV[,TEST]" |
                          "webquestions:TRAIN[,DEV],TEST") -> {split: [QAExample]}
    resolve.AnswerResolver(vocab_dir).resolve(answers) -> entity id | None
    encode.QAEncoder(...).encode(examples) -> QABatch
"""
