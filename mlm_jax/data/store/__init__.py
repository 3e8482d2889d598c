"""The token-store path: prepare once (text -> tokenized shards), then global batch b is a pure
function of (store, data config, seed, b), so resume costs the same at any step and host count.

Nothing here imports the streaming path (mlm_jax/data/text/), nor TensorFlow at import time: the
batch worker processes (`python -m mlm_jax.data.store.batch`) import numpy and array_record only.
"""
