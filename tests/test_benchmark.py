"""tools/benchmark.py train runs the real step and ends with the JSON line docs/performance.md documents."""
import json
import subprocess
import sys

import pytest

from subproc import REPO, cpu_env


def test_train_benchmark_prints_its_json_line():
  """--repeat=2: two fresh processes, each run's figures and the medians and spreads of them."""
  out = subprocess.run(
      [sys.executable, "tools/benchmark.py", "train", "--model=mini", "--seq_len=32", "--batch=4",
       "--steps=3", "--vocab=1000", "--peak_gflops=100", "--repeat", "2"],
      cwd=REPO, env=cpu_env(1), capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  r = json.loads(out.stdout.strip().splitlines()[-1])
  for k in ("tokens_per_sec", "steps_per_sec", "compile_s", "peak_rss_mb", "model_flops_per_token",
            "achieved_tflops", "peak_tflops", "mfu", "page_faults_per_step", "step_peak_rss_mb",
            "compile_peak_rss_mb", "peak_rss_mb_spread", "tokens_per_sec_spread"):
    assert isinstance(r[k], float) and r[k] >= 0, (k, r[k])
  assert r["tokens_per_sec"] > 0 and r["allocator"] == "mimalloc"
  assert "--xla_cpu_enable_concurrency_optimized_scheduler=false" in r["xla_flags"]   # runtime.CPU_XLA_FLAGS
  runs = r["runs"]
  assert r["repeat"] == len(runs) == 2
  for run in runs:   # the process's peak is that of compiling or of the steps, measured apart
    assert run["peak_rss_mb"] == max(run["compile_peak_rss_mb"], run["step_peak_rss_mb"]) > 200
  rss = [run["peak_rss_mb"] for run in runs]
  assert r["peak_rss_mb"] == pytest.approx(sum(rss) / 2)
  assert r["peak_rss_mb_spread"] == pytest.approx((max(rss) - min(rss)) / r["peak_rss_mb"])
  assert r["prediction_slots"] == 5 and r["peak_tflops"] == 0.1   # ceil(0.15 * 32), exact on CPU; as given
  assert abs(r["mfu"] - r["achieved_tflops"] / r["peak_tflops"]) < 1e-9
