"""Downstream tasks for fine-tuning: file readers, encodings (classification, pairs, NER, QA), task assembly.

readers.py reads labeled files, features.py and qa.py turn examples into fixed-length arrays and
model outputs back into predictions, task.py puts one task together for mlm_jax/finetune.py,
config.py is the fine-tuning config schema (and the `:fast` budgets), and suite.py / suite_report.py
are the downstream suite (every task, seeds, one table) that mlm_jax/downstream.py runs.
"""
