#!/usr/bin/env python
"""Will it fit? Compile the train step for a TPU topology on any host and print memory and speed.

  python tools/aot_compile.py --config=configs/xlmr_large.py --topology=v5p:4x4x4 [--config.x=y ...]
  python tools/aot_compile.py --config=configs/xlmr_base.py --topology=v5e:2x2,v5p:2x2x2 --json >> fit.jsonl
  python tools/aot_compile.py --config=configs/xlmr_base.py --topology=v5p:4x4x4 --num_slices=2 \
      --config.mesh.data=2 --config.mesh.fsdp=-1      # two slices joined by DCN: data across, fsdp inside
  python tools/aot_compile.py --config=configs/bert_base.py --topology=h100:8   # NVIDIA GPUs: pip install -e '.[gpu]'
  python tools/aot_compile.py --config=configs/modernbert_base.py --topology=v5p:2x2x2   # a run in phases: each phase
  python tools/aot_compile.py --table=fit.jsonl      # docs/tpu_fit.md's markdown table from those lines
  python tools/aot_compile.py --config=configs/bert_base.py --topology=v5p:2x2x2 --config.data.seq_len=512 \
      --config.model.attention_dropout=0 --config.model.attention_impl=splash   # or xla; scan_layers=true

Needs libtpu (`pip install -e '.[tpu]'`), not a TPU. Prints per device memory against HBM, FLOPs and
XLA's step time (what each figure means: docs/design_notes.md#toolsaot_compilepy). Exit status: 0 when
the step fits on every topology given, 1 when it does not fit on one (with a one-line "does not fit:
..." on stderr saying by how much and what would help) or cannot be placed there (a "not placeable:
..." line: the global batch does not split over the chips), 2 when it could not be checked. A run in
phases is checked phase by phase; a phase that does not fit or cannot be placed does not stop the
others, and a summary at the end has one line per phase and topology.
With --num_slices > 1 it adds the collectives crossing the data-center network and their time at the
chip's DCN bandwidth (--dcn_gbps); --json writes one JSON line per topology.
"""
import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from mlm_jax import runtime
from mlm_jax.config import phases as phases_lib
from mlm_jax.errors import UserError
from mlm_jax.training import aot

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py), fields overridable "
                                          "as --config.train.batch_size=4096.", lock_config=True)
_TOPOLOGY = flags.DEFINE_list("topology", [], "TPU topologies, e.g. v5p:4x4x4 or v5e:2x2,v6e:2x2 "
                              "(generation:chips per dimension), or NVIDIA GPU hosts: h100:8, h200:2x8 "
                              "(hosts x GPUs; needs the [gpu] extra).")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON line per topology instead of the text report.")
_NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "Slices of each topology joined by the data-center network "
                                   "(multi-slice); the mesh's dcn_* fields say which axes span them.")
_DCN_GBPS = flags.DEFINE_float("dcn_gbps", 0.0, "DCN bandwidth per chip in Gbit/s for the DCN time (0 = the "
                               "chip's published figure: v5p 50, v5e 25).")
_TABLE = flags.DEFINE_string("table", "", "Render the markdown table from a file of --json lines and exit.")


def _table(path: str) -> None:
  with open(path) as f:
    reports = [json.loads(line) for line in f if line.strip()]
  multi = any(r.get("num_slices", 1) > 1 for r in reports)
  print(aot.MULTISLICE_HEADER if multi else aot.TABLE_HEADER)
  # Whatever order the lines were written in: by config, then slice size.
  for r in sorted(reports, key=lambda r: (r.get("config", ""), r.get("devices", 0), r["topology"])):
    print(aot.multislice_row(r) if multi else aot.table_row(r))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _TABLE.value:
    _table(_TABLE.value)
    return
  if _CONFIG.value is None or not _TOPOLOGY.value:
    raise app.UsageError("--config and --topology are required (or --table=FILE)")
  name = aot.config_name(flags.FLAGS["config"].config_filename)
  try:
    variants = phases_lib.each_phase(_CONFIG.value)
  except UserError as e:
    runtime.report_user_error(e)
    sys.exit(2)
  verdicts, misfits = [], []
  for topology in _TOPOLOGY.value:
    for phase, config in variants:   # a run in phases: each phase's step (its shapes) is its own fit
      label = f"{name} [{phase}]" if phase else name
      try:
        report = aot.compile_train_step(config, topology, _NUM_SLICES.value, _DCN_GBPS.value)
      except aot.NotPlaceable as e:   # this phase cannot run on this slice; the others are still checked
        report = dict(topology=topology, num_slices=_NUM_SLICES.value, fits=False, placeable=False,
                      reason=e.reason, advice=e.advice)
      except UserError as e:   # AotError and the config checks: one line, no traceback
        runtime.report_user_error(e)
        sys.exit(2)
      report["config"] = name
      if phase:
        report["phase"] = phase
      line = aot.summary_line(report, label)
      print(json.dumps(report) if _JSON.value else
            aot.format_text(report, label) if report.get("placeable", True) else line, flush=True)
      verdicts.append(line)
      if not report["fits"]:
        misfits.append(line)
  if len(verdicts) > 1 and not _JSON.value:   # every phase and topology, also after one that failed
    print("\nsummary:\n" + "\n".join(f"  {v}" for v in verdicts))
  for line in misfits:
    print(line, file=sys.stderr)
  if misfits:
    sys.exit(1)

if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")   # never take an attached accelerator: all work is compiling
  runtime.run(main, exit_code=2)
