"""The environment for the tests' subprocesses of the real binaries: CPU only, quiet TensorFlow, every
compile cached, and exactly `devices` fake CPU devices (the pytest process's own 8-device XLA_FLAGS is
not inherited), run from the repository root."""
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]


def cpu_env(devices: int = 1) -> dict:
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  if devices > 1:
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
  # Every compile into the session's cache (conftest.py), not only those over a second: each of the
  # suite's ~60 runs compiles the same small functions (init, eval step, checks); a hit costs ~10 ms.
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  return env
