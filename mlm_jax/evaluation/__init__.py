"""Evaluation of a pretrained encoder: the held-out MLM evaluator, linear probes, fill-mask."""
