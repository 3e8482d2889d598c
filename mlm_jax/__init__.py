"""mlm_jax: masked-language-model pretraining of BERT / RoBERTa / XLM-R encoders in JAX.

Importing the package runs runtime.bootstrap() first, before jax or TensorFlow is imported.
"""
from mlm_jax import runtime as _runtime

_runtime.bootstrap()

__version__ = "0.1.0"
