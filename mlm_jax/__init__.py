"""mlm_jax: masked-language-model pretraining of BERT / RoBERTa / XLM-R encoders in JAX."""

__version__ = "0.1.0"
