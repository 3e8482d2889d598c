"""Which malloc a CPU training process runs under: mimalloc by default, MLM_JAX_MALLOC=glibc|system.

malloc is bound when a process starts, so `use_mimalloc()` re-executes the program with mimalloc in
LD_PRELOAD; only a binary (startup.bootstrap) or a tool's main() asks for it (`choose_allocator`),
never a mere import. Without mimalloc, `memory_policy` tells glibc to keep freed memory.
Why, and what each allocator costs: docs/design_notes.md#allocator.
"""
from __future__ import annotations

import ctypes
import os
import sys

from mlm_jax.runtime.environment import accelerator_present
from mlm_jax.runtime.one_line_errors import report_user_error

ENV = "MLM_JAX_MALLOC"          # mimalloc (default) | glibc | system
LIBRARY = "MLM_JAX_MIMALLOC_LIBRARY"   # a libmimalloc.so to use instead of the wheel's (a system package's)
ACTIVE = "MLM_JAX_MALLOC_ACTIVE"   # set by the re-exec; also stops a second one
# Purge what is unused after 100 ms, transparent huge pages allowed (docs/design_notes.md#allocator).
SETTINGS = {"MIMALLOC_PURGE_DELAY": "100"}
CHOICES = ("mimalloc", "glibc", "system")


def requested() -> str:
  """The allocator this process should use. MLM_JAX_KEEP_FREED_MEMORY=0 (an older variable) = system."""
  if os.environ.get("MLM_JAX_KEEP_FREED_MEMORY") == "0":
    return "system"
  choice = os.environ.get(ENV, "mimalloc") or "mimalloc"
  if choice not in CHOICES:
    from mlm_jax.errors import UserError
    raise UserError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
  return choice


def library() -> str | None:
  """Path of libmimalloc.so: MLM_JAX_MIMALLOC_LIBRARY's, else the cmeel-mimalloc wheel's; None if missing."""
  given = os.environ.get(LIBRARY)
  if given:
    return given if os.path.isfile(given) else None
  try:
    from importlib import metadata
    path = str(metadata.distribution("cmeel-mimalloc").locate_file("cmeel.prefix/lib/libmimalloc.so"))
  except Exception:   # not installed (or a broken install): fall back to glibc, never fail a run for it
    return None
  return path if os.path.exists(path) else None


def active() -> str:
  """'mimalloc' when this process runs under it, else 'glibc' (kept or as it comes: `memory_policy`)."""
  try:
    with open("/proc/self/maps") as f:
      return "mimalloc" if "libmimalloc" in f.read() else "glibc"
  except OSError:
    return "glibc"


def use_mimalloc(cpu_backend: bool) -> None:
  """Re-execute this program under mimalloc, when it will run on the CPU backend on Linux and the
  library is installed; otherwise return (and `memory_policy` applies the glibc policy).

  Accelerator hosts keep their allocator: their step memory is the device's, and XLA's GPU/TPU
  clients have allocators of their own.
  """
  if sys.platform != "linux" or not cpu_backend or os.environ.get(ACTIVE) or requested() != "mimalloc":
    return
  lib = library()
  if lib is None:   # never fail a run for it: say so once, and glibc keeps freed memory (memory_policy)
    where = f"{LIBRARY}={os.environ[LIBRARY]!r} is no file" if os.environ.get(LIBRARY) else "the cmeel-mimalloc wheel is not installed"
    print(f"warning: no mimalloc ({where}): running on glibc, keeping freed memory; {ENV}=glibc silences this",
          file=sys.stderr, flush=True)
    return
  env = dict(os.environ)
  env[ACTIVE] = "1"
  env["LD_PRELOAD"] = ":".join(filter(None, [lib, env.get("LD_PRELOAD")]))
  for k, v in SETTINGS.items():
    env.setdefault(k, v)
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    os.execve(sys.executable, [sys.executable] + sys.orig_argv[1:], env)
  except OSError:   # no usable interpreter path (embedded Python): run on with glibc
    return


def choose_allocator() -> None:
  """On the CPU backend, re-execute under mimalloc (the module docstring says why); returns where it does not.
  The binaries do it when the package is imported (startup.bootstrap); a tool calls it first in main()."""
  from mlm_jax.errors import UserError
  platforms = os.environ.get("JAX_PLATFORMS", "")
  cpu = platforms.split(",")[0] == "cpu" if platforms else not accelerator_present()
  try:
    requested()
  except UserError as e:   # before absl runs, so no runtime.run to catch it
    report_user_error(e)
    sys.exit(2)
  use_mimalloc(cpu)


def memory_policy() -> str:
  """The CPU allocator policy this process runs with: 'mimalloc', 'glibc-keep' or 'system'.

  mimalloc was chosen at start by `use_mimalloc`. Without it (MLM_JAX_MALLOC=glibc, or the
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
  if active() == "mimalloc":
    logging.info("CPU allocator: mimalloc, purge delay %s ms (%s=glibc|system to change)",
                 os.environ.get("MIMALLOC_PURGE_DELAY", "default"), ENV)
    return "mimalloc"
  if requested() == "system":
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
               "turns it off)", ENV)
  return "glibc-keep"
