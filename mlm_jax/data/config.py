"""Defaults of the `config.data` section (owned by the input pipeline)."""
import ml_collections


def data_defaults() -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.seq_len = 128
  return d
