"""The environment for the tests' subprocesses of the real binaries: CPU only, quiet TensorFlow, every
compile cached, and exactly `devices` fake CPU devices (the pytest process's own 8-device XLA_FLAGS is
not inherited), run from the repository root."""
import os
import pathlib
import signal
import time

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


def kill_when(proc, ready, guard_s: float = 600.0) -> None:
  """kill -9 `proc` as soon as `ready()` holds (polled every 20 ms), then reap it. The run killed is
  configured far longer than the test needs, so it cannot end first on any host; `guard_s` only stops
  a hung run."""
  deadline = time.time() + guard_s
  try:
    while time.time() < deadline and proc.poll() is None:
      if ready():
        proc.send_signal(signal.SIGKILL)
        break
      time.sleep(0.02)
  finally:
    proc.kill()
    proc.wait()
