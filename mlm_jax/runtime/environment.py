"""The process's environment, set before jax or TensorFlow is imported: the platform, the libraries' log
levels and XLA:CPU's flags, from absl's --verbosity read early from argv (docs/design_notes.md#runtime)."""
from __future__ import annotations

import glob
import json
import os
import sys

_VERBOSITY: list[int] = []

# XLA:CPU orders a step for the least memory instead of the most parallel thunks: fewer live
# temporaries at the same speed (docs/design_notes.md#runtime). Process-wide: XLA reads it from
# XLA_FLAGS when the backend starts. Added unless the user's XLA_FLAGS names the flag; only XLA's
# CPU compiler reads it.
_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler"
CPU_XLA_FLAGS = (f"{_SCHEDULER}=false",)
# The flags configure() added to XLA_FLAGS (the user's did not name them) and the XLA_FLAGS it wrote, in the
# environment: a process re-executed under another allocator (allocator.py) or started by one of ours still
# tells our flags from the user's, and a user's XLA_FLAGS set after ours is the user's again.
ADDED_ENV = "MLM_JAX_XLA_FLAGS_ADDED"


def _ours() -> list[str]:
  """The flags of XLA_FLAGS that this package added, where XLA_FLAGS is still the value it wrote."""
  try:
    record = json.loads(os.environ.get(ADDED_ENV) or "{}")
  except ValueError:
    return []
  return list(record.get("added", [])) if record.get("xla_flags") == os.environ.get("XLA_FLAGS", "") else []


def _set_xla_flags(xla_flags: str, added: list[str]) -> None:
  os.environ["XLA_FLAGS"] = xla_flags
  os.environ[ADDED_ENV] = json.dumps({"xla_flags": xla_flags, "added": added})


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
  ours = _ours()   # a parent's additions (or this program's, before a re-exec) are made afresh
  xla_flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f not in ours)
  added = []
  for flag in CPU_XLA_FLAGS:
    if flag.split("=")[0] not in xla_flags:
      xla_flags = f"{xla_flags} {flag}".strip()
      added.append(flag)
  _set_xla_flags(xla_flags, added)
  if v >= 1:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
    return v
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
  if "JAX_PLATFORMS" not in os.environ and not accelerator_present():
    os.environ["JAX_PLATFORMS"] = "cpu"
  return v


def schedule_for_concurrency() -> bool:
  """XLA:CPU's concurrency-optimized order, for a CPU split into several devices (`config.cpu_devices`):
  each device's step holds part of the batch, so the order's extra temporaries are small, and it ran the
  recipe's step 1.02-1.13x faster with two devices at the same peak RSS (docs/performance.md#cpu-devices).
  Leaves a flag the user's XLA_FLAGS named; call before the backend starts. Returns whether it changed it."""
  old, new = f"{_SCHEDULER}=false", f"{_SCHEDULER}=true"
  added = _ours()
  if old not in added:
    return False
  _set_xla_flags(os.environ["XLA_FLAGS"].replace(old, new), [new if f == old else f for f in added])
  return True


def quiet() -> bool:
  return configure() < 1
