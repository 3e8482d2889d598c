"""Process setup for every binary and tool: environment, logging, memory, distributed init.

Some of it must happen before jax or TensorFlow is imported, so importing the package runs `bootstrap()` and
this module imports neither at top level. What each setting does and why: docs/design_notes.md#runtime.
"""
from __future__ import annotations

import ast
import atexit
import contextlib
import ctypes
import glob
import os
import sys
import tempfile
import threading
from typing import Callable, NoReturn

_VERBOSITY: list[int] = []

# XLA:CPU orders a step for the least memory instead of the most parallel thunks: fewer live
# temporaries at the same speed (docs/design_notes.md#runtime). Process-wide: XLA reads it from
# XLA_FLAGS when the backend starts. Added unless the user's XLA_FLAGS names the flag; only XLA's
# CPU compiler reads it.
CPU_XLA_FLAGS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false",)


def verbosity(argv: list[str] | None = None) -> int:
  """absl's --verbosity (or -v / --v) from argv, 0 when absent."""
  argv = sys.argv if argv is None else argv
  for i, a in enumerate(argv):
    for name in ("--verbosity", "--v", "-v"):
      if a == name and i + 1 < len(argv):
        a = f"{name}={argv[i + 1]}"
      if a.startswith(name + "="):
        try:
          return int(a.split("=", 1)[1])
        except ValueError:
          return 0
  return 0


def accelerator_present() -> bool:
  """Whether this host has TPU or GPU hardware JAX could use (device files, or a TPU VM's env)."""
  tpu = glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*") or os.environ.get("TPU_ACCELERATOR_TYPE")
  gpu = glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd")
  return bool(tpu or gpu)


def configure(argv: list[str] | None = None) -> int:
  """Environment for a quiet, correct process; call before importing jax or tensorflow. Returns verbosity."""
  if _VERBOSITY:
    return _VERBOSITY[0]
  v = verbosity(argv)
  _VERBOSITY.append(v)
  xla_flags = os.environ.get("XLA_FLAGS", "")
  for flag in CPU_XLA_FLAGS:
    if flag.split("=")[0] not in xla_flags:
      xla_flags = f"{xla_flags} {flag}".strip()
  os.environ["XLA_FLAGS"] = xla_flags
  if v >= 1:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
    return v
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
  if "JAX_PLATFORMS" not in os.environ and not accelerator_present():
    os.environ["JAX_PLATFORMS"] = "cpu"
  return v


# The binaries, by module and by console script (setup.py): started as one of them, the process
# chooses its allocator when the package is imported, before jax and TensorFlow are.
PROGRAMS = {"mlm_jax.train": "mlm-jax-train", "mlm_jax.finetune": "mlm-jax-finetune",
            "mlm_jax.downstream": "mlm-jax-downstream"}


def program(orig_argv: list[str] | None = None) -> str:
  """The binary this process was started as (`python -m mlm_jax.train` or `mlm-jax-train`), or ''."""
  argv = list(sys.orig_argv if orig_argv is None else orig_argv)[1:]
  i = 0
  while i < len(argv):
    a = argv[i]
    if a == "-m":
      return argv[i + 1] if i + 1 < len(argv) and argv[i + 1] in PROGRAMS else ""
    if a.startswith("-m"):
      return a[2:] if a[2:] in PROGRAMS else ""
    if a in ("-W", "-X"):   # interpreter options with a value
      i += 2
      continue
    if a.startswith("-"):   # -c CODE, -u, -O, ...: not a binary of ours unless -m follows
      if a == "-c":
        return ""
      i += 1
      continue
    name = os.path.basename(a)   # a script: one of the console scripts?
    return next((m for m, script in PROGRAMS.items() if name == script), "")
  return ""


def bootstrap() -> None:
  """What `import mlm_jax` does first: `configure()`, and in a binary on the CPU `choose_allocator()`."""
  configure()
  if program():
    choose_allocator()


def choose_allocator() -> None:
  """On the CPU backend, re-execute under mimalloc (allocator.py says why); returns where it does not.
  The binaries do it when the package is imported (`bootstrap`); a tool calls it first in main()."""
  from mlm_jax import allocator
  from mlm_jax.errors import UserError
  platforms = os.environ.get("JAX_PLATFORMS", "")
  cpu = platforms.split(",")[0] == "cpu" if platforms else not accelerator_present()
  try:
    allocator.requested()
  except UserError as e:   # before absl runs, so no runtime.run to catch it
    report_user_error(e)
    sys.exit(2)
  allocator.use_mimalloc(cpu)


def quiet() -> bool:
  return configure() < 1


@contextlib.contextmanager
def stderr_to(path: str):
  """Send the process's fd 2 (where C++ libraries log) to `path` for the block."""
  sys.stderr.flush()
  saved = os.dup(2)
  with open(path, "w") as f:
    os.dup2(f.fileno(), 2)
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)


def tensorflow():
  """TensorFlow for tf.data, kept off every GPU (JAX owns them); imported quietly unless --verbosity>=1."""
  if "tensorflow" in sys.modules:
    return _hide_gpus(sys.modules["tensorflow"])
  if not quiet():
    import tensorflow as tf
    return _hide_gpus(tf)
  with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
    try:
      with stderr_to(log.name):
        import tensorflow as tf
        _hide_gpus(tf)   # lists devices, which is where a GPU-less host logs cuInit errors
    except Exception:
      sys.stderr.write(log.read())
      raise
  return tf


def _hide_gpus(tf):
  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:  # devices already initialised by an earlier TF user: nothing to change
    pass
  return tf


def memory_policy() -> str:
  """The CPU allocator policy this process runs with: 'mimalloc', 'glibc-keep' or 'system'.

  mimalloc was chosen at start by `allocator.use_mimalloc`. Without it (MLM_JAX_MALLOC=glibc, or the
  library missing), glibc is told to keep the memory XLA frees: one arena (the main heap), no mmap for
  large blocks, no trimming (no page faults per step, but a heap that fragments:
  docs/design_notes.md#allocator). MLM_JAX_MALLOC=system leaves glibc as it comes.

  Call it before anything starts the JAX backend: a thread keeps the glibc arena it first allocated
  from. It starts the backend itself to learn the platform and, on accelerators, puts glibc's arena
  limit back. Equivalent at process start:
  GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=<huge>.
  """
  import jax
  from absl import logging
  from mlm_jax import allocator
  if allocator.active() == "mimalloc":
    logging.info("CPU allocator: mimalloc, purge delay %s ms (%s=glibc|system to change)",
                 os.environ.get("MIMALLOC_PURGE_DELAY", "default"), allocator.ENV)
    return "mimalloc"
  if allocator.requested() == "system":
    return "system"
  try:
    libc = ctypes.CDLL("libc.so.6")
  except OSError:
    return "system"
  m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8   # mallopt parameters, from glibc's <malloc.h>
  if not libc.mallopt(m_arena_max, 1):
    return "system"
  if jax.default_backend() != "cpu":
    libc.mallopt(m_arena_max, 8 * (os.cpu_count() or 1))   # glibc's default limit on 64-bit hosts
    return "system"
  if not (libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, -1)):   # -1: never trim
    return "system"
  logging.info("CPU allocator: glibc keeping freed memory (one arena, no mmap, no trim; %s=system "
               "turns it off)", allocator.ENV)
  return "glibc-keep"


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


def initialize_distributed(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1,
                           heartbeat_timeout_s: int = 60) -> None:
  """Joins JAX's multi-controller runtime when this is one process of several; else does nothing.

  Explicit arguments (or MLM_JAX_COORDINATOR / MLM_JAX_NUM_PROCESSES / MLM_JAX_PROCESS_ID) win;
  otherwise TPU VM slices and SLURM jobs are detected by JAX itself (multi-slice TPU jobs by the
  MEGASCALE_* variables the TPU runtime sets, or MLM_JAX_DISTRIBUTED=1, which launch/tpu_vm.sh
  --num_slices sets for slices of one host each). On CPU the processes talk
  through gloo, so several processes on one machine form one job (tests, launch/local_multiprocess.sh).
  A process that stops heart-beating makes the others fail after `heartbeat_timeout_s` instead of
  waiting forever in a collective.
  """
  import jax
  from absl import logging
  from mlm_jax.errors import ConfigError
  coordinator_address = coordinator_address or os.environ.get("MLM_JAX_COORDINATOR", "")
  num_processes = num_processes or int(os.environ.get("MLM_JAX_NUM_PROCESSES", "0"))
  if process_id < 0:
    process_id = int(os.environ.get("MLM_JAX_PROCESS_ID", "-1"))
  kw = dict(heartbeat_timeout_seconds=heartbeat_timeout_s, initialization_timeout=max(heartbeat_timeout_s, 120))
  if coordinator_address:
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ConfigError(f"coordinator {coordinator_address!r} given, but num_processes={num_processes} and "
                        f"process_id={process_id}: expected 0 <= process_id < num_processes")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id, **kw)
  elif os.environ.get("SLURM_JOB_ID") and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
    jax.distributed.initialize(**kw)
  elif (os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") >= 1 or os.environ.get("MEGASCALE_COORDINATOR_ADDRESS")
        or os.environ.get("MLM_JAX_DISTRIBUTED") == "1"):   # several hosts of a slice, or several slices
    jax.distributed.initialize(**kw)
  else:
    return
  logging.info("process %d of %d, %d local / %d global devices", jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


def sync_processes(name: str) -> None:
  """Barrier across processes (a no-op with one process)."""
  import jax
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def first_process_then_all(name: str, work: Callable[[], None]) -> None:
  """`work()` on process 0 only (a file every process then reads), then a barrier named `name`."""
  import jax
  if jax.process_index() == 0:
    work()
  sync_processes(name)


def start(**distributed) -> None:
  """What a training binary does first inside main: distributed init, memory policy, logging."""
  initialize_distributed(**distributed)
  memory_policy()   # before setup_logging: that starts the backend
  setup_logging()


# What a collective or the coordination service says when another process of the run is gone (gloo on
# CPU, NCCL on GPUs, the coordination service's heartbeats and barriers).
_PEER_GONE = ("Gloo", "gloo", "NCCL", "Connection reset by peer", "Connection closed by peer", "heartbeat",
              "coordination service", "Barrier timed out", "Socket closed", "tasks are unhealthy")


def peer_lost(e: BaseException) -> bool:
  """Whether `e`, raised in a process of several, means another process of the run has stopped."""
  if "jax" not in sys.modules or isinstance(e, (KeyboardInterrupt, SystemExit)):
    return False
  import jax
  from mlm_jax.errors import PeerLost, UserError
  if isinstance(e, PeerLost):
    return True
  if isinstance(e, UserError) or jax.process_count() == 1:
    return False
  return any(m in str(e) for m in _PEER_GONE)


def _first_line(e: BaseException) -> str:
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  return " ".join((lines[0] if lines else type(e).__name__).split())[:300]


def exit_peer_lost(e: BaseException) -> NoReturn:
  """One line, then exit 1 at once: the distributed runtime's own shutdown would wait for the lost process
  at a barrier and then abort with a C++ stack trace."""
  import jax
  print(f"error: process {jax.process_index()} of {jax.process_count()} stops: another process of this run is gone "
        f"({_first_line(e)}). Nothing newer was saved; the last complete checkpoint is intact: rerun the same "
        "command on every host to resume from it", file=sys.stderr)
  _flush_all()
  os._exit(1)


def report_user_error(e: Exception) -> None:
  """A UserError as one line on stderr."""
  print(f"error: {' '.join(str(e).split())}", file=sys.stderr)


def _logs_to_file() -> bool:
  """Whether absl writes its log to a file (--log_dir) rather than to the console's stderr."""
  from absl import logging
  stream = getattr(logging.get_absl_handler().python_handler, "stream", sys.stderr)
  return stream not in (sys.stderr, sys.__stderr__)


def exit_now(code=0) -> NoReturn:
  """Ends the process as `sys.exit(code)` would, without the interpreter's teardown.

  A binary's teardown (freeing every module's objects, then TensorFlow's and XLA's C++ destructors)
  took ~2 s after its last line on a 2-core VM, for nothing: what a normal exit does that keeps
  output is done here first, in its order: non-daemon threads joined (threading's own shutdown,
  which also stops concurrent.futures pools), the atexit handlers (logging's flush and close,
  jax.distributed's shutdown barrier, weakref finalizers: store workers, temporary folders), then
  Python's and C's stdio buffers flushed. The status is sys.exit's: None 0, an int itself, anything
  else printed to stderr and 1. Only a process's last call: tests/test_train.py checks that a
  run's metrics, TensorBoard events and checkpoints are whole after it.
  """
  if code is None:
    status = 0
  elif isinstance(code, int):
    status = code
  else:
    print(code, file=sys.stderr)
    status = 1
  shutdown = getattr(threading, "_shutdown", None)   # what Py_Finalize calls first
  if shutdown is not None:
    shutdown()
  atexit._run_exitfuncs()
  _flush_all()
  os._exit(status)


def _flush_all() -> None:
  """Python's and C's buffered output (a pipe's is block-buffered), and absl's log."""
  if "absl.logging" in sys.modules:
    sys.modules["absl.logging"].flush()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError, AttributeError):   # closed, or a broken pipe: nothing left to keep
      pass
  try:
    ctypes.CDLL(None).fflush(None)   # C libraries' buffered stdout (a pipe's is block-buffered)
  except (OSError, AttributeError):
    pass


def run(main: Callable[[list], None], exit_code: int = 1) -> NoReturn:
  """app.run(main) with one-line errors, then `exit_now`: a UserError from main exits `exit_code`,
  and a --config.* override naming a key that does not exist exits 2. An exception escaping main
  ends the process the usual way (its traceback, status 1).

  absl parses the overrides into the locked ConfigDict before `main` starts and lets the KeyError
  escape as a traceback; errors raised once `main` runs are left alone, except UserErrors.
  """
  try:
    _run(main, exit_code)
  except SystemExit as e:
    exit_now(e.code)
  exit_now(0)


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
