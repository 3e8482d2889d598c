"""Input side of mlm_jax: two paths to one batch format, and the tokenizers both use.

  input.py      make_input(config, input_kind, ...): the one place that picks a run's input
  specs.py      source specs (`name=spec` strings), their files, mixing weights; no TensorFlow
  best_fit.py   best-fit packing of documents into rows over a window of open rows (both paths)
  config.py     defaults of `config.data`
  text/         streaming path: sources -> tf.data tokenize, pack, mix, batch (resume replays)
  store/        token-store path: prepare once, then batches as pure functions of the step
  tokenizers/   one interface; sentencepiece, WordPiece / byte-level BPE; sentencepiece training

This file stays free of TensorFlow on purpose: `mlm_jax.config.defaults` imports `data.config`, and
loading a config should not cost a 5 s TensorFlow import. Only text/ imports TensorFlow at import
time (hiding every GPU from it); the store path and the tokenizers import it lazily, for gs://
paths, FarmHash and TFDS.
"""
