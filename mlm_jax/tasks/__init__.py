"""Downstream tasks for fine-tuning: file readers, encodings (classification, pairs, NER, QA), metrics,
one task's assembly (task.py) and the suite's catalogue. The runners are in mlm_jax/finetuning/.
"""
