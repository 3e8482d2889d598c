"""mlm_jax: masked-language-model pretraining of BERT / RoBERTa / XLM-R encoders in JAX.

Importing the package sets the process up before jax or TensorFlow is imported (runtime.bootstrap:
platform, log levels, XLA flags, and in a binary on the CPU the allocator).
"""
from mlm_jax import runtime as _runtime

_runtime.bootstrap()

__version__ = "0.1.0"
