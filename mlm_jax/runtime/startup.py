"""What a process does first: importing the package (`bootstrap`), and a training binary's main (`start`).

`bootstrap` runs before jax or TensorFlow is imported, so it sets the environment and, in a binary on
the CPU, re-executes under mimalloc while nothing else has started (allocator.py)."""
from __future__ import annotations

import os
import sys

from mlm_jax.runtime import allocator, distributed, log_setup
from mlm_jax.runtime.environment import configure, schedule_for_concurrency

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
    allocator.choose_allocator()


def use_cpu_devices(n: int) -> None:
  """`config.cpu_devices`: this process's CPU as `n` JAX devices (jax_num_cpu_devices), and for more than
  one XLA's concurrency-optimized schedule (`environment.schedule_for_concurrency`); 0 leaves JAX's
  default (one device, or XLA_FLAGS' host device count). Must come before the backend starts."""
  from mlm_jax.errors import ConfigError
  if isinstance(n, bool) or not isinstance(n, int) or n < 0:
    raise ConfigError(f"config.cpu_devices={n!r}: expected 0 (JAX's default) or the number of CPU devices")
  if n:
    import jax
    try:
      jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:   # jax refuses once its backend has started
      raise ConfigError(f"config.cpu_devices={n}: JAX's backend has started already with {jax.device_count()} "
                        "device(s); the training binary sets it before anything runs on a device") from None
    if n > 1:
      from absl import logging
      ours = schedule_for_concurrency()
      logging.info("CPU: %d JAX devices, %s", n, "XLA's concurrency-optimized schedule" if ours
                   else f"the schedule XLA_FLAGS names ({os.environ.get('XLA_FLAGS', '')})")


def start(cpu_devices: int = 0, **distributed_args) -> None:
  """What a training binary does first inside main: its CPU devices, distributed init, memory policy, logging."""
  use_cpu_devices(cpu_devices)
  distributed.initialize_distributed(**distributed_args)
  allocator.memory_policy()   # before setup_logging: that starts the backend
  log_setup.setup_logging()
