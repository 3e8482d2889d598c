#!/usr/bin/env python
"""Where a run's wall time went, over all its restarts: the breakdown of WORKDIR/goodput.json.

  python tools/goodput.py --workdir=DIR           # one line per run (process), then the totals
  python tools/goodput.py --workdir=DIR --json    # the same as one JSON object

Categories (mlm_jax/workdir/goodput.py): productive steps, compile (each process's first step),
input waits, evaluation, probes, checkpoint saves (blocking part) and restores, start-up, lost
work (steps recomputed after a restart: those between the checkpoint a run resumed from and the
newest step the killed run logged) and the time between runs (from a killed run's last record to
the next start). Percentages are of the span from the first start to the last record.
Errors are one line on stderr and exit code 2.
"""
import argparse
import json
import os
import time

from mlm_jax import runtime


def _parser():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True, help="a training or fine-tuning workdir")
  p.add_argument("--json", action="store_true", help="print one JSON object (segments and totals)")
  runtime.add_verbosity_flag(p)
  return p


def _run_line(i: int, seg: dict) -> str:
  s = seg["seconds"]
  lost = seg.get("lost", {})
  when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seg["start_time"]))
  status = "killed or lost (no final record)" if seg["status"] == "running" else seg["status"]
  text = (f"run {i}: {when} on {seg['host']} pid {seg['pid']}, steps {seg['start_step']}..{seg['end_step']}, "
          f"{seg['wall_seconds']:.1f} s, {status}: steps {s['step']:.1f} s, compile {s['compile']:.1f} s, "
          f"input {s['input']:.1f} s, eval {s['eval']:.1f} s, probes {s['probe']:.1f} s, saves {s['save']:.1f} s, "
          f"restore {s['restore']:.1f} s, start-up {s['startup']:.1f} s")
  if lost.get("steps"):
    text += (f"; resumed at step {lost['from_step']}: steps {lost['from_step'] + 1}..{lost['to_step']} recomputed "
             f"({lost['seconds']:.1f} s of earlier runs lost)")
  return text


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  from mlm_jax.errors import UserError
  from mlm_jax.workdir import goodput
  try:
    if not os.path.exists(os.path.join(args.workdir, goodput.FILE)) and "://" not in args.workdir:
      raise UserError(f"{os.path.join(args.workdir, goodput.FILE)}: missing (a workdir of a run of this version?)")
    segments = goodput.read(args.workdir)
    if not segments:
      raise UserError(f"{os.path.join(args.workdir, goodput.FILE)}: no runs recorded (or not valid JSON)")
  except UserError as e:
    runtime.report_user_error(e)
    return 2
  t = goodput.totals(segments)
  if args.json:
    print(json.dumps(dict(segments=segments, totals=t), indent=1))
    return 0
  for i, seg in enumerate(segments):
    print(_run_line(i, seg))
  span = max(t["span_seconds"], 1e-9)
  names = dict(step="productive steps", compile="compile", input="input waits", eval="evaluation", probe="probes",
               save="checkpoint saves", restore="restores", startup="start-up", lost="lost work",
               between_runs="between runs")
  print(f"total over {t['runs']} run(s), {span:.1f} s from first start to last record:")
  for k, name in names.items():
    extra = f"  ({t['lost_steps']} steps recomputed)" if k == "lost" else ""
    print(f"  {name:18s} {t['seconds'][k]:10.1f} s  {100 * t['seconds'][k] / span:5.1f}%{extra}")
  print(goodput.summary_line(t))
  return 0


if __name__ == "__main__":
  runtime.exit_now(main())
