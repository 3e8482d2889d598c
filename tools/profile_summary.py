#!/usr/bin/env python
"""Summarize a captured profile: the top operations by self time and the step-time breakdown.

  python -m mlm_jax.train --config=configs/demo.py --workdir=DIR --config.train.profile_steps=(100,5)
  python tools/profile_summary.py --workdir=DIR              # the newest capture in DIR/tensorboard
  python tools/profile_summary.py --trace=DIR/tensorboard/plugins/profile/2026_01_01_00_00_00/host.xplane.pb
  python tools/profile_summary.py --workdir=DIR --json --top=30

Reads the trace with jax's own reader (mlm_jax/training/trace_summary.py): XLA ops of the first
device plane on TPU/GPU, the XLA:CPU thunks of the host plane on CPU; steps from the loop's step
annotations. TensorBoard's profile plugin (`tensorboard --logdir=DIR/tensorboard`) shows the same
trace in full. Errors are one line on stderr and exit code 2.
"""
import argparse
import json

from mlm_jax import runtime


def _parser():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--workdir", help="a run's workdir: its newest capture under tensorboard/plugins/profile")
  src.add_argument("--trace", help="a .xplane.pb file, or a capture folder holding them (one per host)")
  p.add_argument("--top", type=int, default=15, help="operations to list")
  p.add_argument("--json", action="store_true", help="one JSON object per trace file")
  runtime.add_verbosity_flag(p)
  return p


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  runtime.setup_tool_logging()
  from mlm_jax.errors import UserError
  from mlm_jax.training import trace_summary
  try:
    for path in trace_summary.find_traces(args.workdir or args.trace):
      s = trace_summary.summarize(path, args.top)
      print(json.dumps(s) if args.json else trace_summary.format_text(s), flush=True)
  except UserError as e:
    runtime.report_user_error(e)
    return 2
  return 0


if __name__ == "__main__":
  runtime.exit_now(main())
