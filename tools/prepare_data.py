#!/usr/bin/env python
"""Prepare a token store once, for long runs: text sources -> tokenized, sharded, resumable.

  python tools/prepare_data.py --sources='en=corpus/en/*.txt.gz' --sources='de=tsv:1:de/*.gz' \\
      --tokenizer=spm.model --out=/data/store --num_workers=8
  # the same units as an Apache Beam pipeline (pip install -e '.[beam]'); the flags the tool does
  # not know are Beam's pipeline options (Dataflow, Flink, Spark:
  # docs/token_store.md#apache-beam-beyond-one-machine)
  python tools/prepare_data.py ... --runner=DirectRunner --num_workers=8
  python tools/prepare_data.py ... --out=gs://BUCKET/store --runner=DataflowRunner --project=P \\
      --region=R --temp_location=gs://BUCKET/tmp --setup_file=./setup.py

Sources take the syntax of `config.data.sources` (name=spec; text globs, tsv:FIELD:GLOB,
jsonl:FIELD:GLOB, tfds:NAME:SPLIT[:FEATURE], tfrecord:GLOB). Re-running skips finished units; killed and re-run,
the store is byte-identical, whichever ran it. Train from it with
`--config.data.sources="('store:/data/store',)"`.
"""
import argparse
import json
import logging
import sys

from mlm_jax import paths, runtime


def main(argv=None):
  from mlm_jax.data.store import prepare
  from mlm_jax.errors import UserError
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
  p.add_argument("--sources", action="append", required=True, help="name=spec, repeatable")
  p.add_argument("--tokenizer", required=True,
                 help="sentencepiece .model, tokenizer.json, vocab.txt, or a transformers folder")
  p.add_argument("--out", required=True, help="store directory")
  p.add_argument("--doc_format", default="line", choices=("line", "blank_line"))
  p.add_argument("--eval_percent", type=float, default=1.0)
  p.add_argument("--max_line_bytes", type=int, default=prepare.DEFAULT_MAX_LINE_BYTES)
  p.add_argument("--strict", action="store_true", help="any repaired/skipped input is an error")
  p.add_argument("--tfds_data_dir", default="")
  p.add_argument("--num_workers", type=int, default=None,
                 help="worker processes (default 1); with --runner=DirectRunner its worker processes, "
                      "with another runner Beam's own --num_workers")
  p.add_argument("--runner", default="", help="run as an Apache Beam pipeline on this runner (one of "
                 "DirectRunner, DataflowRunner, FlinkRunner, SparkRunner, PortableRunner); the flags "
                 "this tool does not know are Beam's pipeline options")
  p.add_argument("--progress_s", type=float, default=10.0)
  p.add_argument("--report_seq_len", type=int, default=512,
                 help="the summary's real-token share per source is for rows of this length")
  runtime.add_verbosity_flag(p)
  args, beam_args = p.parse_known_args(argv)
  if beam_args and not args.runner:
    p.error(f"unrecognized arguments: {' '.join(beam_args)} (Beam's options need --runner)")
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
  opts = prepare.Options(sources=tuple(args.sources), tokenizer=args.tokenizer,
                         doc_format=args.doc_format, eval_percent=args.eval_percent,
                         max_line_bytes=args.max_line_bytes, tfds_data_dir=args.tfds_data_dir,
                         strict=args.strict)
  try:
    if args.runner:
      manifest = _run_beam(opts, args, beam_args)
    else:
      manifest = prepare.prepare(opts, args.out, num_workers=args.num_workers or 1,
                                 progress_s=args.progress_s)
  except UserError as e:
    runtime.report_user_error(e)
    return 1
  summary = {k: {f: v[f] for f in ("documents", "tokens", "eval_documents", "shards")}
             for k, v in manifest["sources"].items()}
  if not paths.is_remote(args.out):   # the reader needs a local or mounted store
    for name, share in _real_fractions(args.out, manifest, args.report_seq_len).items():
      summary[name][f"real_fraction_at_{args.report_seq_len}"] = round(share, 4)
  print(json.dumps(summary, sort_keys=True))
  return 0


def _run_beam(opts, args, beam_args) -> dict:
  """The Beam pipeline to its end; prints this run's counters per source. A failed unit is one line."""
  import time
  from mlm_jax.data.store import beam_pipeline
  from mlm_jax.errors import DataError, UserError
  t0 = time.time()
  log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
  try:
    manifest, counters = beam_pipeline.run(opts, args.out, args.runner, beam_args,
                                           num_workers=args.num_workers, log=log)
  except UserError:
    raise
  except Exception as e:  # noqa: BLE001 - a runner reports a worker's error as its own exception
    line = beam_pipeline.failure_line(e)
    if "cannot prepare source" not in line:
      raise
    raise DataError(line) from None
  for source, c in sorted(counters.items()):
    rest = ", ".join(f"{k} {v:,}" for k, v in sorted(c.items())
                     if k not in ("documents", "tokens", "units_prepared", "units_skipped"))
    log(f"[prepare] {source}: {c.get('units_prepared', 0)} units prepared, {c.get('units_skipped', 0)} "
        f"already done; {c.get('documents', 0):,} documents, {c.get('tokens', 0):,} tokens"
        + (f"; {rest}" if rest else ""))
  tokens = sum(c.get("tokens", 0) for c in counters.values())
  log(f"[prepare] {args.runner}: {tokens:,} tokens in {time.time() - t0:,.1f}s "
      f"({tokens / max(time.time() - t0, 1e-9):,.0f} tokens/s)")
  return manifest


def _real_fractions(root: str, manifest: dict, seq_len: int) -> dict:
  """Per source: the share of row slots holding a real token when its training documents are
  packed into `seq_len` rows (segmented, best-fit, the default window; a fixed document order, so
  within a fraction of a percent of what any seed gives). Built from the token counts alone."""
  import numpy as np
  from mlm_jax.config import defaults
  from mlm_jax.data.store import shards, index as store_index
  store, window = shards.Store(root), defaults.data_defaults().packing_window
  out = {}
  for name in manifest["sources"]:
    lens = store.lengths(name, "train")
    if lens.size:
      order = np.random.default_rng(0).permutation(lens.size)
      ix = store_index.build(lens, seq_len, "segmented", order, "best", window)
      out[name] = float(ix["row_tokens"].sum()) / (seq_len * (ix["row_ptr"].size - 1))
  return out


if __name__ == "__main__":
  runtime.exit_now(main())
