#!/usr/bin/env python
"""Merge checkpoints: the (weighted) mean of their parameters, as a workdir that to_hf, init_from,
mlm_jax.downstream and fill_mask read.

  python tools/merge_checkpoints.py --workdir=RUN --last=3 --out=RUN_merged        # the last 3 of a run
  python tools/merge_checkpoints.py --workdir=RUN --steps=600,700,800 --out=OUT     # given steps
  python tools/merge_checkpoints.py BRANCH_A BRANCH_B:800 --weights=0.7,0.3 --out=OUT   # branches (latest, or :STEP)

Sources must share the architecture and the tokenizer (one line names the difference otherwise); the
merged checkpoint's step is the newest source step, its config.json the last source's. docs/phases.md#merging.
Errors are one line on stderr and exit code 2.
"""
import argparse
import json

from mlm_jax import runtime


def _ints(text: str) -> tuple:
  return tuple(int(x) for x in text.split(",") if x.strip()) if text else ()


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("sources", nargs="*", help="WORKDIR or WORKDIR:STEP (branches of one run)")
  p.add_argument("--workdir", default="", help="one run: with --last or --steps")
  p.add_argument("--last", type=int, default=0, help="the last K checkpoints of --workdir")
  p.add_argument("--steps", default="", help="comma-separated steps of --workdir")
  p.add_argument("--weights", default="", help="comma-separated weights, one per checkpoint (default: equal)")
  p.add_argument("--out", required=True, help="the merged workdir (new)")
  runtime.add_verbosity_flag(p)
  a = p.parse_args(argv)
  runtime.setup_tool_logging()
  from mlm_jax.errors import UserError
  from mlm_jax.workdir import merge
  try:
    if bool(a.workdir) == bool(a.sources):
      raise UserError("give --workdir (with --last or --steps) or WORKDIR[:STEP] sources, not both")
    if a.workdir:
      chosen = merge.select(a.workdir, a.last, _ints(a.steps))
    else:
      chosen = []
      for s in a.sources:
        head, sep, tail = s.rpartition(":")
        chosen += merge.select(head, steps=(int(tail),)) if sep and tail.isdigit() else merge.select(s)
    weights = [float(x) for x in a.weights.split(",")] if a.weights else None
    summary = merge.merge(chosen, a.out, weights)
  except UserError as e:
    runtime.report_user_error(e)
    return 2
  print(json.dumps(summary))
  return 0


if __name__ == "__main__":
  runtime.exit_now(main())
