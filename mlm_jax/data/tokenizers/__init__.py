"""Tokenizers: one interface (base.py), three families (sentencepiece: spm.py; WordPiece and
byte-level BPE via Hugging Face `tokenizers`: hf.py), `load.load(path)` choosing the family, and
sentencepiece training with language-balanced sampling (train.py).
"""
