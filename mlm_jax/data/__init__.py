"""Input side of mlm_jax: tokenizer, document sources, packed-batch pipeline.

This file stays free of TensorFlow on purpose: `mlm_jax.defaults` imports `data.config`, and
loading a config should not cost a 5 s TensorFlow import. The modules that do use TensorFlow
(`sources`, and through it `pipeline`) hide every GPU from it when they are imported.
"""
