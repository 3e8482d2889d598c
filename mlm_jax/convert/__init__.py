"""Conversion to and from Hugging Face transformers: one module per family, whole folders, tokenizer files."""
