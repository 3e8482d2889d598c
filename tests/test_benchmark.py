"""tools/benchmark.py train runs the real step and ends with the JSON line docs/performance.md documents."""
import json
import subprocess
import sys

import pytest

from subproc import REPO, cpu_env


def test_train_benchmark_prints_its_json_line():
  """--repeat=3: three fresh processes, each run's figures and the medians and spreads of them; FLOPs
  and MFU against the architecture's count written out here (PaLM's 6 per matmul parameter per token).
  --devices=2 without XLA_FLAGS: each process's CPU split into two devices (config.cpu_devices), the
  batch sharded over them in XLA's concurrency-optimized schedule, MFU against the one CPU's peak."""
  out = subprocess.run(
      [sys.executable, "tools/benchmark.py", "train", "--model=mini", "--seq_len=32", "--batch=4",
       "--steps=3", "--vocab=1000", "--peak_gflops=100", "--repeat", "3", "--devices=2"],
      cwd=REPO, env=cpu_env(1), capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  r = json.loads(out.stdout.strip().splitlines()[-1])
  for k in ("tokens_per_sec", "steps_per_sec", "compile_s", "peak_rss_mb", "model_flops_per_token",
            "achieved_tflops", "peak_tflops", "mfu", "page_faults_per_step", "step_peak_rss_mb",
            "compile_peak_rss_mb", "peak_rss_mb_spread", "tokens_per_sec_spread"):
    assert isinstance(r[k], float) and r[k] >= 0, (k, r[k])
  assert r["tokens_per_sec"] > 0 and r["allocator"] == "mimalloc" and r["devices"] == 2
  # runtime.CPU_XLA_FLAGS' memory-first schedule, switched to the concurrency-optimized one for two devices
  assert "--xla_cpu_enable_concurrency_optimized_scheduler=true" in r["xla_flags"]
  runs = r["runs"]
  assert r["repeat"] == len(runs) == 3
  for run in runs:   # the process's peak is that of compiling or of the steps, measured apart
    assert run["peak_rss_mb"] == max(run["compile_peak_rss_mb"], run["step_peak_rss_mb"]) > 200
  for k in ("peak_rss_mb", "tokens_per_sec"):   # the middle of three runs, and the spread around it
    values = sorted(run[k] for run in runs)
    assert r[k] == values[1]
    assert r[k + "_spread"] == pytest.approx((values[2] - values[0]) / values[1])
  assert r["prediction_slots"] == 5 and r["peak_tflops"] == 0.1   # ceil(0.15 * 32), exact on CPU; as given
  # mini: 4 layers, H=256, I=1024; vocab 1000, 32 positions, the head on 5 slots of 32.
  L, H, I, V, S = 4, 256, 1024, 1000, 32
  flops = 6 * L * (4 * H * H + 2 * H * I) + 12 * L * H * S + 6 * (H * H + H * V) * 5 / S
  assert r["model_flops_per_token"] == pytest.approx(flops)
  assert r["mfu"] == pytest.approx(r["tokens_per_sec"] * flops / 0.1e12)   # of the median run
  assert r["steps_per_sec"] == pytest.approx(r["tokens_per_sec"] / (4 * 32))


def test_the_matmul_peak_is_timed_for_a_quarter_second_at_least():
  """MFU's denominator on CPU: the best call of at least `min_seconds` of calls, not of the first few
  (which run slow while threads wake)."""
  import time
  from mlm_jax.model import flops
  start = time.perf_counter()
  peak = flops.measure_matmul_peak(n=64, repeats=1, dtype="bfloat16", min_seconds=0.25)
  assert time.perf_counter() - start >= 0.25 and peak > 0


def test_compare_reports_a_variant_per_token():
  """`benchmark.py compare` with a variant of half the batch: the same step a token, so XLA's FLOPs and bytes
  a token match the base's, and the fastest steps compare in tokens/s, not in seconds a step."""
  out = subprocess.run(
      [sys.executable, "tools/benchmark.py", "compare", "--config=configs/demo.py", "--vocab=1000", "--rounds=2",
       "--steps=2", "--warmup=1", "train.batch_size=8,data.seq_len=32", "train.batch_size=4,data.seq_len=32"],
      cwd=REPO, env=cpu_env(1), capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  r = json.loads(out.stdout.strip().splitlines()[-1])
  full, half = r["variants"]["train.batch_size=8,data.seq_len=32"], r["variants"]["train.batch_size=4,data.seq_len=32"]
  assert half["xla_flops_ratio_to_base"] == pytest.approx(full["xla_flops_ratio_to_base"], rel=0.05)
  assert half["flops_per_token"] == full["flops_per_token"]
  for v in (full, half):
    assert v["fastest_ratio_to_base"] == pytest.approx(
        v["fastest_step_tokens_per_sec"] / r["variants"]["base"]["fastest_step_tokens_per_sec"])
