"""The environment for the tests' subprocesses of the real binaries: CPU only, quiet TensorFlow, and
exactly `devices` fake CPU devices (the pytest process's own 8-device XLA_FLAGS is not inherited),
run from the repository root."""
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]


def cpu_env(devices: int = 1) -> dict:
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  if devices > 1:
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
  return env
