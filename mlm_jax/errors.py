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


class Preempted(Exception):
  """Not an error: the run saved `step` and stopped (SIGTERM on a host). The binaries exit with
  EXIT_CODE and one line, so a scheduler that restarts failed jobs restarts it."""

  EXIT_CODE = 75   # EX_TEMPFAIL (sysexits.h): a temporary failure; the same command resumes

  def __init__(self, step: int, processes: int = 1):
    super().__init__(f"saved step {step}" + (f" on all {processes} processes" if processes > 1 else ""))
    self.step, self.processes = step, processes


class PeerLost(Exception):
  """Another process of a multi-process run stopped (killed, crashed, its host lost): this one stops too,
  at once, without waiting for saves or barriers that can no longer complete."""
