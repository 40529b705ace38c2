"""Closed-book question answering as entity prediction (paper section "Open domain Question
Answering"): questions -> model batches with an answer-position mention.

    encode.QAEncoder(...).encode(examples) -> QABatch

The question files and answer resolution are data code: `eae_data.qa.examples` and
`eae_data.qa.resolve`.
"""
