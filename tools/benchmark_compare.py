"""`benchmark.py compare`: the train step of a config against its variants, timed in turns in one process.

  python tools/benchmark.py compare --config=configs/en_cpu_hour.py --vocab=8000 \
      :gptbert :lamb :zloss :ltg model.extra_norms=True model.mlp=geglu,model.intermediate_size=512

Each positional argument is a variant of --config: `:NAME` adds a config variant (FILE:NAME), and
`section.field=VALUE[,section.field=VALUE]` sets fields. Every step is compiled first; then, `--rounds`
times, each step runs `--steps` steps on the same random rows (benchmark_setup.py's), the order reversed every
other round, so a machine whose speed drifts slows every variant alike. Prints, per variant, the median
tokens/s over the rounds and the median of its per-round ratio to the base's tokens/s, XLA's count of the
compiled step's FLOPs and bytes accessed a token against the base's (what the load of the machine cannot move), and the
tokens/s of its fastest step and that ratio to the base's fastest (on a machine other jobs share, other work
only ever adds time to a step: the fastest steps are the closest to the step's own cost); the last line
is one JSON object.
"""
from __future__ import annotations

import argparse
import ast
import json
import statistics
import time

import benchmark_setup   # beside this file
from mlm_jax import runtime


def _parse(argv) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="benchmark.py compare", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", required=True, help="FILE[:VARIANT]: the base")
  p.add_argument("--vocab", type=int, default=32000)
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--steps", type=int, default=10, help="timed steps of each variant in a round")
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("variants", nargs="+", help=":NAME or section.field=VALUE[,section.field=VALUE]")
  return p.parse_args(argv)


def _overrides(spec: str) -> dict:
  out = {}
  for item in spec.split(","):
    key, sep, value = item.partition("=")
    if not sep or "." not in key:
      raise SystemExit(f"variant {spec!r}: expected ':NAME' or 'section.field=VALUE[,...]'")
    try:
      out[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      out[key] = value
  return out


def _trainer(args, spec: str):
  """(compiled step, state, batches, FLOPs per token) of the base (spec '') or a variant."""
  import jax
  from mlm_jax.model import sharding
  from mlm_jax.objectives import masking
  from mlm_jax.training import trainer as trainer_lib
  base_file, _, base_variant = args.config.partition(":")
  variant, overrides = base_variant, {}
  if spec.startswith(":"):
    variant = ",".join(v for v in (base_variant, spec[1:]) if v)
  elif spec:
    overrides = _overrides(spec)
  one = argparse.Namespace(config=f"{base_file}:{variant}" if variant else base_file, vocab=args.vocab,
                           dtype="float32", max_predictions=0, steps=args.steps, warmup=args.warmup, devices=1,
                           seq_len=None, batch=None, dropout=None, matmul=None)
  run, _ = benchmark_setup.resolved_run(benchmark_setup.with_config(one, overrides), jax.devices()[0].platform)
  c = run.config
  tr = trainer_lib.make_trainer(c, sharding.make_mesh(c.mesh, jax.devices()[:1]), run.objective)
  batches = [jax.device_put(b, tr.batch_sharding) for b in benchmark_setup.random_batches(one)]
  state, key = tr.init(), jax.random.key(0)
  compiled = tr.train_step.lower(state, batches[0], key, tr.values).compile()
  step = lambda state, batch, key: compiled(state, batch, key, tr.values)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost   # XLA's own count of the compiled step
  for i in range(args.warmup):
    state, _ = step(state, batches[i % 4], key)
  fpt = run.objective.flops_per_token(c, one.seq_len, masking.max_predictions(c.masking, one.seq_len))
  tokens = one.batch * one.seq_len   # XLA's counts a token, as a variant may set train.batch_size or data.seq_len
  return dict(step=step, state=state, batches=batches, key=key, tokens=tokens, flops=fpt,
              xla_flops=float(cost.get("flops", 0.0)) / tokens,
              xla_bytes=float(cost.get("bytes accessed", 0.0)) / tokens)


def main(argv) -> None:
  import jax
  args = _parse(argv)
  runtime.memory_policy()   # as the training binary does on CPU
  names = ["base"] + args.variants
  t0 = time.perf_counter()
  runs = {name: _trainer(args, "" if name == "base" else name) for name in names}
  compile_s = time.perf_counter() - t0
  rates, fastest = {name: [] for name in names}, {name: float("inf") for name in names}
  for r in range(args.rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      x = runs[name]
      jax.block_until_ready(x["state"])
      t = t_block = time.perf_counter()
      for i in range(args.steps):
        x["state"], m = x["step"](x["state"], x["batches"][i % 4], x["key"])
        jax.block_until_ready((x["state"].params, m))
        now = time.perf_counter()
        fastest[name], t = min(fastest[name], now - t), now
      rates[name].append(x["tokens"] * args.steps / (time.perf_counter() - t_block))
  out = {}
  best = {name: runs[name]["tokens"] / fastest[name] for name in names}   # tokens/s, as a variant may set the batch
  for name in names:
    ratios = [a / b for a, b in zip(rates[name], rates["base"])]
    out[name] = dict(tokens_per_sec=statistics.median(rates[name]), ratio_to_base=statistics.median(ratios),
                     ratio_min=min(ratios), ratio_max=max(ratios), fastest_step_tokens_per_sec=best[name],
                     fastest_ratio_to_base=best[name] / best["base"], flops_per_token=runs[name]["flops"],
                     flops_ratio_to_base=runs[name]["flops"] / runs["base"]["flops"],
                     xla_flops_ratio_to_base=runs[name]["xla_flops"] / max(runs["base"]["xla_flops"], 1e-30),
                     xla_bytes_ratio_to_base=runs[name]["xla_bytes"] / max(runs["base"]["xla_bytes"], 1e-30))
    o = out[name]
    print(f"{name:45s} {o['tokens_per_sec']:7.0f} tok/s x{o['ratio_to_base']:.3f} ({o['ratio_min']:.2f}-"
          f"{o['ratio_max']:.2f});  fastest step {best[name]:7.0f} tok/s x{o['fastest_ratio_to_base']:.3f};  "
          f"FLOPs/token x{o['flops_ratio_to_base']:.3f};  XLA's FLOPs x{o['xla_flops_ratio_to_base']:.3f}, bytes "
          f"x{o['xla_bytes_ratio_to_base']:.3f}")
  print(json.dumps(dict(bench="mlm_jax_compare", config=args.config, vocab=args.vocab, rounds=args.rounds,
                        steps=args.steps, compile_s=compile_s, variants=out)))
