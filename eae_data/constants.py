"""Ids and file names shared by the data formats and the model, which imports them from here."""

NULL_ENTITY = -1  # the null entity e_0: an unlinked mention

# Special tokens of bert-base-uncased's WordPiece vocabulary.
PAD_TOKEN_ID, CLS_TOKEN_ID, SEP_TOKEN_ID, MASK_TOKEN_ID = 0, 101, 102, 103

# The entity vocabulary `eae data build` writes, copied beside the weights by pretraining:
# entity ids -> titles, and the aliases and redirects that resolve names to ids.
VOCAB_FILES = ("entities.parquet", "aliases.parquet", "redirects.parquet")
