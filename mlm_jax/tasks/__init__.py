"""Downstream tasks for fine-tuning: file readers, encodings (classification, pairs, NER, QA), task assembly.

readers.py reads labeled files, features.py and qa.py turn examples into fixed-length arrays and
model outputs back into predictions, task.py puts one task together for mlm_jax/finetune.py, and
config.py is the fine-tuning config schema.
"""
