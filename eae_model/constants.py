"""Ids shared by the model and the data formats (importable without torch)."""

NULL_ENTITY = -1  # the null entity e_0: an unlinked mention

# Special tokens of bert-base-uncased's WordPiece vocabulary.
PAD_TOKEN_ID, CLS_TOKEN_ID, SEP_TOKEN_ID, MASK_TOKEN_ID = 0, 101, 102, 103
