"""absl logging for binaries and tools: INFO on process 0, orbax's own records only with --verbosity>=1."""
from __future__ import annotations

from mlm_jax.runtime.environment import configure


def setup_logging() -> None:
  """INFO on process 0, WARNING elsewhere; orbax's own log only with --verbosity>=1 (its failures reach
  the caller as exceptions, which the binaries report in one line: a failed save's background threads
  would otherwise print a traceback each)."""
  import jax
  from absl import logging
  v = configure()
  if v < 1:
    logging.set_verbosity(logging.INFO if jax.process_index() == 0 else logging.WARNING)
    logging.get_absl_handler().addFilter(lambda r: not _from_orbax(r))


def _from_orbax(record) -> bool:
  """A record of orbax's, or asyncio's 'exception was never retrieved' about a future of orbax's: one
  with orbax in its traceback, or a checkpoint write's failure set from TensorStore's threads (no Python
  frames at all; its message names the checkpoint's temporary folder)."""
  if "/orbax/" in record.pathname:
    return True
  if record.name == "asyncio" and record.exc_info and ".orbax-checkpoint-tmp" in str(record.exc_info[1]):
    return True
  if record.name == "asyncio" and record.exc_info and record.exc_info[2] is not None:
    tb = record.exc_info[2]
    while tb is not None:
      if "/orbax/" in tb.tb_frame.f_code.co_filename:
        return True
      tb = tb.tb_next
  return False


def add_verbosity_flag(parser) -> None:
  """The argparse tools' --verbosity, with the meaning of absl's (read early by `configure`)."""
  parser.add_argument("-v", "--verbosity", type=int, default=0,
                      help="1: show every library's log (TensorFlow, libtpu, orbax, sentencepiece's trainer)")


def setup_tool_logging() -> None:
  """Tools print their results; the libraries' INFO/WARNING records (orbax's restore chatter) only with -v 1."""
  from absl import logging
  logging.set_verbosity(logging.INFO if configure() >= 1 else logging.ERROR)
