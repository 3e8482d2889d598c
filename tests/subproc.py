"""The environment for the tests' subprocesses of the real binaries: CPU only, quiet TensorFlow, every
compile cached, and exactly `devices` fake CPU devices (the pytest process's own 8-device XLA_FLAGS is
not inherited), run from the repository root."""
import os
import pathlib
import signal
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


# XLA:CPU's LLVM backend at -O0: the suite's models are tiny, so most of its runs spend their time compiling,
# and -O0 compiles them ~2x faster. HLO's own passes (fusion, sharding, scheduling) still run; each test
# compares numbers computed under this same flag. The user's binaries keep XLA's default.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def cpu_env(devices: int = 1, quick_compile: bool = True) -> dict:
  """`quick_compile=False` for runs whose steps take the time, not their compiles (at -O0 they run slower)."""
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  flags = [TEST_XLA_FLAGS] if quick_compile else []
  if devices > 1:
    flags.append(f"--xla_force_host_platform_device_count={devices}")
  if flags:
    env["XLA_FLAGS"] = " ".join(flags)
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
