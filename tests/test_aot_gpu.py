"""Ahead-of-time compile of the real train step for an NVIDIA H100 host, on this CPU (tools/aot_compile.py).

The CUDA plugin (the `[gpu]` extra, jax[cuda12]: ~5 GB, not in the default test environment)
compiles for compile-only GPU devices described by a target config (mlm_jax/training/gpu_targets.py);
no GPU or driver is needed. Skipped without the plugin. One compile of a 2-layer model, ~1 minute.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from subproc import REPO

from test_aot import TINY



def _cuda_plugin() -> bool:
  try:
    return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  except ModuleNotFoundError:   # no jax_plugins package at all
    return False


pytestmark = pytest.mark.skipif(not _cuda_plugin(), reason="the CUDA plugin is not installed: pip install -e '.[gpu]'")


def test_tiny_model_compiles_for_eight_h100s_and_reports_memory_and_collectives():
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
  env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
  p = subprocess.run([sys.executable, "tools/aot_compile.py", *TINY, "--topology=h100:8", "--config.train.batch_size=64",
                      "--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2", "--json"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert p.returncode == 0, p.stdout + p.stderr[-3000:]
  r = json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][0])
  assert r["device_kind"] == "NVIDIA H100 80GB HBM3" and r["devices"] == 8 and r["num_slices"] == 1
  assert r["hbm_bytes"] == int(80 * 2**30 * 0.9) and r["fits"] and 0 < r["total_bytes"] < r["hbm_bytes"]
  assert r["alias_bytes"] >= r["state_bytes"] > 0
  assert r["collectives"]["all-reduce"]["count"] > 0 and r["collectives"]["all-gather"]["count"] > 0
  assert any("no cost analysis" in n for n in r["notes"]) and r["optimal_seconds"] == 0
