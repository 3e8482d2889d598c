"""Input side: two paths to one batch format, text/ (streaming) and store/ (token store), made in inputs.py,
and the tokenizers both use.

No TensorFlow at import here, in specs.py or packing.py; only text/ imports it at import time, the store
path and the tokenizers lazily (docs/design_notes.md#data).
"""
