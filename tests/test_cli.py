"""The runtime tuning the binaries share (mlm_jax/runtime.py)."""
import subprocess
import sys

import pytest
from subproc import REPO, cpu_env

# A jitted function whose two 64 MiB temporaries XLA allocates from its worker threads on every
# call (cheap: 4 GFLOP): the page faults per call show whether that memory went back to the OS.
_PROBE = """
import resource
from mlm_jax import runtime
kept = runtime.keep_freed_memory()
import jax, jax.numpy as jnp

@jax.jit
def f(a, b):
  return jnp.tanh(a @ b) @ b.T      # a @ b and its tanh: two [8192, 2048] temporaries

a = jnp.full((8192, 64), 0.01, jnp.float32)
b = jnp.full((64, 2048), 0.01, jnp.float32)
for _ in range(3):
  f(a, b).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
  f(a, b).block_until_ready()
print(kept, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def _probe(keep: str):
  env = dict(cpu_env(1), MLM_JAX_KEEP_FREED_MEMORY=keep)
  out = subprocess.run([sys.executable, "-c", _PROBE], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  kept, faults = out.stdout.split()[-2:]
  return kept == "True", float(faults)


def test_keep_freed_memory_stops_xla_scratch_refaulting_and_can_be_turned_off():
  kept, faults_kept = _probe("1")
  off, faults_off = _probe("0")
  assert kept and not off
  # Without it each call faults its 128 MiB of temporaries in again: 32768 pages of 4 KiB each.
  if faults_off < 2000:
    pytest.skip(f"{faults_off:.0f} faults per call without it: this OS backs the memory with huge pages")
  assert faults_kept < 0.5 * faults_off, (faults_kept, faults_off)
