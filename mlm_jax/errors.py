"""The one base class of the errors a user can fix: a file, a config key, a value, a checkpoint.

Binaries and tools catch `UserError` alone and print its message as one line; anything else is a bug
and keeps its traceback. The subclasses name the area and subclass ValueError.
"""


class UserError(ValueError):
  """A problem with the user's input, named in a one-line message."""


class ConfigError(UserError):
  """A config key with a value that is not allowed; the message names the key and the choices."""


class DataError(UserError):
  """Bad input data or data config (corpora, labeled files, token stores)."""


class CheckpointError(UserError):
  """A checkpoint or workdir that cannot be read, or that another model config wrote."""


class ConversionError(UserError):
  """A Hugging Face folder or conversion request that cannot be honoured."""


class NoMaskedLM(ConversionError):
  """A model without an MLM head (a base or sentence-transformers model, an ELECTRA discriminator) asked
  for masked-token predictions (fill-mask, pseudo-log-likelihood, BLiMP)."""
