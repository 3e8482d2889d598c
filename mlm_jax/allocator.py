"""Which malloc a CPU training process runs under, chosen before anything large is imported.

XLA:CPU allocates a step's temporaries afresh every step (1.0 GB for BERT-base at batch 8), from
its worker threads. What each allocator does with them, measured with `tools/benchmark.py train
--repeat=5` on a 2-core VM (figures in docs/performance.md):

- **glibc as it comes** serves those blocks with mmap and unmaps them on free, so every step
  page-faults its scratch in again: ~190k minor faults per mini step, 15-20% of the step time.
  Peak RSS is the lowest (base: 3.4 GB).
- **glibc keeping freed memory** (one arena, no mmap, no trimming: this project's policy until
  round 3, `MLM_JAX_MALLOC=glibc`): no faults, but one heap shared by every thread fragments,
  and how badly depends on thread timing: the same small-model command peaked at 3.4 GB in one
  run and 6.9 GB in the next, base at 5.9 GB.
- **mimalloc** (default; the `cmeel-mimalloc` wheel, a setup.py requirement on Linux) segregates
  blocks by size per thread and keeps a freed region mapped for `MIMALLOC_PURGE_DELAY` ms before
  returning it to the OS. 100 ms outlives the gap between a block's free and its reuse within a
  step, so the fault count stays near zero, while memory XLA stops using (the compiler's, a
  finished step's) goes back: peaks far below the kept heap's and steady from run to run (1-3%),
  at its speed. Transparent huge pages stay allowed (mimalloc's default): turned off
  (MIMALLOC_ALLOW_THP=0, 4 KiB purges) base peaked 250 MB lower (3.4 instead of 3.65 GB, before
  runtime.CPU_XLA_FLAGS), but mimalloc then faults fresh 4 KiB pages every step (43-95k, whatever
  the purge delay, even with purging off) and runs ~12% slower at mini and ~8% at base; with them
  the faults drop to ~7k at mini.

An allocator is chosen when the process starts (the C library's malloc is bound at load time),
so `use_mimalloc()` re-executes the program with the library in LD_PRELOAD. Binaries call
`runtime.choose_allocator()` right after `runtime.configure()`, only under
`if __name__ == "__main__"` (importing a binary's module, as tests do, never re-executes the
importing process). Child processes inherit it.
"""
from __future__ import annotations

import os
import sys

ENV = "MLM_JAX_MALLOC"          # mimalloc (default) | glibc | system
ACTIVE = "MLM_JAX_MALLOC_ACTIVE"   # set by the re-exec; also stops a second one
# Purge what is unused after 100 ms (transparent huge pages allowed: see above).
SETTINGS = {"MIMALLOC_PURGE_DELAY": "100"}
CHOICES = ("mimalloc", "glibc", "system")


def requested() -> str:
  """The allocator this process should use. MLM_JAX_KEEP_FREED_MEMORY=0 (before round 3) = system."""
  if os.environ.get("MLM_JAX_KEEP_FREED_MEMORY") == "0":
    return "system"
  choice = os.environ.get(ENV, "mimalloc") or "mimalloc"
  if choice not in CHOICES:
    from mlm_jax.errors import UserError
    raise UserError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
  return choice


def library() -> str | None:
  """Path of the installed libmimalloc.so (the cmeel-mimalloc wheel), or None."""
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
  if lib is None:
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
