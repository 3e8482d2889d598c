"""Which malloc a CPU training process runs under: mimalloc by default, MLM_JAX_MALLOC=glibc|system.

malloc is bound when a process starts, so `use_mimalloc()` re-executes the program with mimalloc in
LD_PRELOAD; only a binary (runtime.bootstrap) or a tool's main() asks for it, never a mere import.
Why, and what each allocator costs: docs/design_notes.md#allocator.
"""
from __future__ import annotations

import os
import sys

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
  """'mimalloc' when this process runs under it, else 'glibc' (kept or as it comes: runtime.memory_policy)."""
  try:
    with open("/proc/self/maps") as f:
      return "mimalloc" if "libmimalloc" in f.read() else "glibc"
  except OSError:
    return "glibc"


def use_mimalloc(cpu_backend: bool) -> None:
  """Re-execute this program under mimalloc, when it will run on the CPU backend on Linux and the
  library is installed; otherwise return (and `runtime.memory_policy` applies the glibc policy).

  Accelerator hosts keep their allocator: their step memory is the device's, and XLA's GPU/TPU
  clients have allocators of their own.
  """
  if sys.platform != "linux" or not cpu_backend or os.environ.get(ACTIVE) or requested() != "mimalloc":
    return
  lib = library()
  if lib is None:   # never fail a run for it: say so once, and glibc keeps freed memory (runtime.memory_policy)
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
