"""A binary's main run with one-line errors: a UserError, a bad --config.* override, a preemption and a
lost process of the run each end the process with one line on stderr and its own exit status."""
from __future__ import annotations

import ast
import sys
import traceback
from typing import Callable, NoReturn

from mlm_jax.runtime.distributed import peer_lost
from mlm_jax.runtime.peer_watch import exit_peer_lost, farewell, leave_after_error
from mlm_jax.runtime.teardown import exit_now, exit_status


def report_user_error(e: Exception) -> None:
  """A UserError as one line on stderr."""
  print(f"error: {' '.join(str(e).split())}", file=sys.stderr)


def _logs_to_file() -> bool:
  """Whether absl writes its log to a file (--log_dir) rather than to the console's stderr."""
  from absl import logging
  stream = getattr(logging.get_absl_handler().python_handler, "stream", sys.stderr)
  return stream not in (sys.stderr, sys.__stderr__)


def run(main: Callable[[list], None], exit_code: int = 1) -> NoReturn:
  """app.run(main) with one-line errors, then `exit_now`: a UserError from main exits `exit_code`,
  and a --config.* override naming a key that does not exist exits 2. An exception escaping main
  prints its traceback and exits 1. In a run of several processes, one that ends with an error
  leaves at once, so that the others stop with one line instead of waiting for it (peer_watch.py).

  absl parses the overrides into the locked ConfigDict before `main` starts and lets the KeyError
  escape as a traceback; errors raised once `main` runs are left alone, except UserErrors.
  """
  try:
    _run(main, exit_code)
  except SystemExit as e:
    _end(e.code)
  except Exception:   # a bug: its traceback and status 1; in a run of several the others then stop too
    traceback.print_exc()
    _end(1)
  _end(0)


def _end(code) -> NoReturn:
  """exit_now, after the farewell of a process of several that ends on purpose (finished or preempted):
  the others must not take its links closing for a loss; one that ends with an error leaves at once,
  so that they stop too (peer_watch.py)."""
  from mlm_jax.errors import Preempted
  status = exit_status(code)   # sys.exit("message"): the message printed, status 1
  if status in (0, Preempted.EXIT_CODE):
    farewell()
  else:
    leave_after_error(status)
  exit_now(status)


def _run(main: Callable[[list], None], exit_code: int) -> None:
  from absl import app
  from mlm_jax.errors import Preempted, UserError
  started = []

  def wrapped(argv):
    started.append(True)
    try:
      return main(argv)
    except Preempted as e:
      print(f"preempted: {e}; the same command resumes from it", file=sys.stderr)
      sys.exit(Preempted.EXIT_CODE)
    except Exception as e:
      if peer_lost(e):
        exit_peer_lost(e)
      if not isinstance(e, UserError):
        raise
      if _logs_to_file():   # the log file keeps it too; on the console the error line alone says it
        from absl import logging
        logging.error("%s", e)
      report_user_error(e)
      sys.exit(exit_code)

  try:
    app.run(wrapped)
  except (KeyError, AttributeError, TypeError, ValueError) as e:
    if started:
      raise
    bad = " ".join(a for a in sys.argv[1:] if a.startswith("--config."))
    msg = str(e.args[0] if e.args else e)
    if msg[:1] in "'\"" and "\\n" in msg:   # some ml_collections errors arrive repr()-quoted
      try:
        msg = ast.literal_eval(msg)
      except (ValueError, SyntaxError):
        pass
    print(f"error: bad config override {bad}: unknown key {' '.join(msg.split())}", file=sys.stderr)
    sys.exit(2)
