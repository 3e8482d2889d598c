#!/usr/bin/env python
"""Throughput benchmarks; the last line of output is one JSON object.

  python tools/benchmark.py train --model=mini --seq_len=128 --batch=32 --steps=20 --vocab=32000
  python tools/benchmark.py train --config=configs/en_cpu_hour.py:gptbert --vocab=8000   # a config's step
  python tools/benchmark.py compare --config=configs/en_cpu_hour.py --vocab=8000 :ltg    # tools/benchmark_compare.py
  python tools/benchmark.py train --model=base --seq_len=512 --batch=32 --dtype=bfloat16 --dropout=0 \
      --attention_impl=cudnn     # GPU; xla for the comparison (--attention_impl=splash on TPU)
  python tools/benchmark.py train --config=configs/en_cpu_hour.py   # a config file's model, batch and length
  python tools/benchmark.py input [flags of tools/benchmark_input.py]
  python tools/benchmark.py pll --workdir=DEMO_WORKDIR [--model=mini]   # tools/benchmark_pll.py

`train` runs the real train step on random batches: tokens/s, compile time, peak RSS (whole process,
compile and step phases), FLOPs, MFU, page faults per step; `--repeat=N` runs it N times in fresh
processes. Compare with peers only side by side (fields: docs/design_notes.md#toolsbenchmarkpy).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

from mlm_jax import runtime   # importing mlm_jax sets the process up before jax and TensorFlow
from mlm_jax.config.sizes import SIZES

import benchmark_setup   # beside this file


def _parse(argv) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="benchmark.py train")
  p.add_argument("--model", choices=sorted(SIZES), default="mini")
  p.add_argument("--config", default="",
                 help="a config file (configs/NAME.py[:variant]): its model, objective, masking, optimizer, data.seq_len "
                      "and train.batch_size "
                      "instead of --model's size; --seq_len, --batch, --vocab, --dropout and --dtype given "
                      "explicitly still override them")
  p.add_argument("--seq_len", type=int, default=None, help="default 128")
  p.add_argument("--batch", type=int, default=None, help="default 32")
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--warmup", type=int, default=5,
                 help="untimed steps after compiling; glibc's heap reaches its high-water mark in these")
  p.add_argument("--vocab", type=int, default=None, help="default 32000")
  p.add_argument("--dtype", default=None, help="compute dtype (float32 | bfloat16); default float32")
  p.add_argument("--dropout", type=float, default=None, help="default 0.1")
  p.add_argument("--mask_mode", default="token")
  p.add_argument("--devices", type=int, default=None,
                 help="devices in the data axis (default 1, or a --config's cpu_devices); on the CPU, the process's "
                      "CPU split into that many devices (config.cpu_devices)")
  p.add_argument("--peak_gflops", type=float, default=0.0, help="skip measuring the matmul peak")
  p.add_argument("--attention_impl", default="auto", help="auto | xla | splash | cudnn (model.attention_impl)")
  p.add_argument("--matmul", default=None,
                 help="auto | xla | f32_out (model.matmul; auto: f32_out on CPU below float32, else xla)")
  p.add_argument("--scan_layers", action="store_true", help="model.scan_layers: one lax.scan over the layers")
  p.add_argument("--remat", default="none", help="none | full | dots (model.remat)")
  p.add_argument("--repeat", type=int, default=1,
                 help="run N times, each in a fresh process; report every run, the medians and the spread")
  p.add_argument("--max_predictions", type=int, default=0,
                 help="prediction slots per sequence; 0 = masking.max_predictions' rule for the platform")
  return benchmark_setup.with_config(p.parse_args(argv))


def _timed_steps(run, mesh, batches, args) -> dict:
  """Compile, warm up, then time `args.steps` steps: seconds, page faults and the last loss."""
  import jax
  from mlm_jax.training import trainer as trainer_lib
  t0 = time.perf_counter()
  tr = trainer_lib.make_trainer(run.config, mesh, run.objective)
  state = tr.init()
  batches = [jax.device_put(x, tr.batch_sharding) for x in batches]
  key = jax.random.key(0)
  compiled = tr.train_step.lower(state, batches[0], key, tr.values).compile()
  compile_s = time.perf_counter() - t0
  compile_peak = _reset_peak_rss()
  for i in range(args.warmup):
    state, m = compiled(state, batches[i % 4], key, tr.values)
  jax.block_until_ready(state)
  times = []
  faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  t_all = time.perf_counter()
  for i in range(args.steps):
    t = time.perf_counter()
    state, m = compiled(state, batches[i % 4], key, tr.values)
    jax.block_until_ready((state.params, m))
    times.append(time.perf_counter() - t)
  total = time.perf_counter() - t_all
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
  return dict(compile_s=compile_s, times=times, total=total, faults=faults, compile_peak=compile_peak,
              step_peak=_peak_rss_mb(),
              loss=float(m["loss_sum"] / m["num_predictions"]))


def _peak_rss_mb() -> float:
  """VmHWM: the peak resident set since start or the last reset (ru_maxrss is reset with it)."""
  with open("/proc/self/status") as f:
    return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024


def _reset_peak_rss() -> float:
  """The peak so far; then restart VmHWM from the current RSS (Linux >= 4.0)."""
  peak = _peak_rss_mb()
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
  return peak


def _repeat(argv, args) -> None:
  """The same command args.repeat times in fresh processes (peak RSS is per process); one JSON line
  per run on stderr, then the summary."""
  import subprocess
  n = args.repeat
  cmd = [sys.executable, __file__, "train", *argv, "--repeat=1"]   # the last value given wins
  runs, peak_given = [], bool(args.peak_gflops)
  for k in range(n):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if out.returncode:
      sys.exit(f"benchmark run {k + 1} of {n} failed with exit code {out.returncode}")
    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if not peak_given:   # measure the matmul peak once
      cmd.append(f"--peak_gflops={runs[0]['peak_tflops'] * 1e3}")
      peak_given = True
    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
  summary = dict(runs[0], runs=[{k: r[k] for k in _PER_RUN} for r in runs], repeat=n)
  for k in _PER_RUN:
    values = [r[k] for r in runs]
    med = statistics.median(values)
    summary[k] = med
    summary[k + "_spread"] = (max(values) - min(values)) / med if med else 0.0
  scale = summary["tokens_per_sec"] / runs[0]["tokens_per_sec"]   # the rates of the median run, not of the first
  for k in ("steps_per_sec", "achieved_tflops", "mfu", "dtype_mfu"):
    summary[k] = runs[0][k] * scale
  print(json.dumps(summary))


_PER_RUN = ("tokens_per_sec", "peak_rss_mb", "step_peak_rss_mb", "compile_peak_rss_mb", "page_faults_per_step")


def train_main(argv):
  args = _parse(argv)
  if args.repeat > 1:
    return _repeat(argv, args)
  import jax
  from mlm_jax.model import flops, sharding
  from mlm_jax.objectives import masking
  from mlm_jax.runtime import cpu_features

  if os.environ.get("JAX_PLATFORMS") == "cpu" and args.devices > 1:
    runtime.use_cpu_devices(args.devices)   # as the training binary does with config.cpu_devices
  allocator = runtime.memory_policy()   # as the training binary does on CPU
  devices = jax.devices()[:args.devices]
  run, impl_reason = benchmark_setup.resolved_run(args, devices[0].platform)
  c = run.config
  mesh = sharding.make_mesh(c.mesh, devices)
  r = _timed_steps(run, mesh, benchmark_setup.random_batches(args), args)
  b, s, times, total = args.batch, args.seq_len, r["times"], r["total"]
  tokens_per_sec = b * s * args.steps / total
  slots = masking.max_predictions(c.masking, s)
  fpt = run.objective.flops_per_token(c, s, slots)
  peak = args.peak_gflops * 1e9 if args.peak_gflops else flops.measure_matmul_peak()
  # below float32 also the rate of the compute dtype's matmul (bfloat16 operands, float32 results)
  dtype_peak = peak if c.model.dtype == "float32" else flops.measure_matmul_peak(dtype=c.model.dtype)
  result = dict(
      bench="mlm_jax_train", model=args.config or args.model, objective=c.objective, seq_len=s, batch=b, vocab=args.vocab, dtype=args.dtype,
      dropout=args.dropout, devices=args.devices, device=str(jax.devices()[0].platform),
      attention_impl=c.model.attention_impl, attention_impl_reason=impl_reason, matmul=c.model.matmul,
      scan_layers=c.model.scan_layers,
      remat=c.model.remat,
      tokens_per_sec=tokens_per_sec, steps_per_sec=args.steps / total,
      step_time_median_s=statistics.median(times), step_time_min_s=min(times), compile_s=r["compile_s"],
      peak_rss_mb=max(r["compile_peak"], r["step_peak"]), compile_peak_rss_mb=r["compile_peak"],
      step_peak_rss_mb=r["step_peak"],
      model_flops_per_token=fpt, dense_equivalent_flops_per_token=flops.dense_flops_per_token(c.model, s),
      prediction_slots=slots, achieved_tflops=tokens_per_sec * fpt / 1e12, peak_tflops=peak / 1e12,
      mfu=flops.mfu(tokens_per_sec, fpt, peak), dtype_peak_tflops=dtype_peak / 1e12,
      dtype_mfu=flops.mfu(tokens_per_sec, fpt, dtype_peak), final_loss=r["loss"],
      allocator=allocator, xla_flags=os.environ.get("XLA_FLAGS", ""),
      cpu_bf16_instructions=cpu_features.bf16_instructions() if devices[0].platform == "cpu" else None,
      page_faults_per_step=r["faults"] / args.steps, versions=dict(jax=jax.__version__),
  )
  print(json.dumps(result))


def main():
  if len(sys.argv) < 2 or sys.argv[1] not in ("train", "compare", "input", "pll"):
    sys.exit("usage: benchmark.py {train|compare|input|pll} [flags]  (see --help of each)")
  if sys.argv[1] == "train":
    train_main(sys.argv[2:])
  elif sys.argv[1] == "compare":
    import benchmark_compare   # beside this file
    benchmark_compare.main(sys.argv[2:])
  elif sys.argv[1] == "pll":
    import benchmark_pll   # beside this file
    benchmark_pll.main(sys.argv[2:])
  else:
    import benchmark_input   # beside this file, on sys.path as the script's folder
    benchmark_input.main(sys.argv[2:])


if __name__ == "__main__":
  runtime.choose_allocator()   # on CPU: re-executes under mimalloc (mlm_jax/runtime/allocator.py), before jax is imported
  runtime.exit_now(main())
