"""The data side of Entities as Experts, pure Python (no torch, no Ray, no model): the MediaWiki
dump reader and wikitext parser, ~500-byte contexts with wordpiece-aligned mentions, alias and
NER mentions, the Parquet shard schema, the synthetic world, the QA data formats and answer
resolution, BERT's WordPiece tokenizer, and the ids and file names the model shares with them.
`eae_model` imports from here, never the reverse (docs/architecture.md).
"""
