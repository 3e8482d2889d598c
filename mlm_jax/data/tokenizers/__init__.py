"""Tokenizers: one interface (base.py), three families (sentencepiece: spm.py; WordPiece and byte-level BPE
via Hugging Face `tokenizers`: hf_tokenizers.py), `load.load(path)` choosing the family, and
sentencepiece training with language-balanced sampling (spm_training.py).
"""
