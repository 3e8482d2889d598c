"""Fine-tuning: the library (finetuner.py), task heads, the downstream suite's runner and report."""
