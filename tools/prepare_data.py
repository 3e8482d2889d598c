#!/usr/bin/env python
"""Prepare a token store once, for long runs: text sources -> tokenized, sharded, resumable.

  python tools/prepare_data.py --sources='en=corpus/en/*.txt.gz' --sources='de=tsv:1:de/*.gz' \\
      --tokenizer=spm.model --out=/data/store --num_workers=8
  # on each of N machines (launch/*.sh run a tool on every host), task 0 writes the manifest:
  python tools/prepare_data.py ... --task_index=$i --num_tasks=$N
  python tools/prepare_data.py ... --finalize      # only write the manifest (all units done)

Sources take the syntax of `config.data.sources` (name=spec; text globs, tsv:FIELD:GLOB,
tfds:NAME:SPLIT[:FEATURE], tfrecord:GLOB). Re-running skips finished units; killed and re-run,
the store is byte-identical. Train from it with `--config.data.sources="('store:/data/store',)"`.
"""
import argparse
import json
import logging

from mlm_jax import runtime


def main(argv=None):
  from mlm_jax.data.store import prepare
  from mlm_jax.errors import UserError
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--sources", action="append", required=True, help="name=spec, repeatable")
  p.add_argument("--tokenizer", required=True,
                 help="sentencepiece .model, tokenizer.json, vocab.txt, or a transformers folder")
  p.add_argument("--out", required=True, help="store directory")
  p.add_argument("--doc_format", default="line", choices=("line", "blank_line"))
  p.add_argument("--eval_percent", type=float, default=1.0)
  p.add_argument("--max_line_bytes", type=int, default=prepare.DEFAULT_MAX_LINE_BYTES)
  p.add_argument("--strict", action="store_true", help="any repaired/skipped input is an error")
  p.add_argument("--tfds_data_dir", default="")
  p.add_argument("--num_workers", type=int, default=1)
  p.add_argument("--task_index", type=int, default=0)
  p.add_argument("--num_tasks", type=int, default=1)
  p.add_argument("--finalize", action="store_true", help="only write the manifest")
  p.add_argument("--progress_s", type=float, default=10.0)
  p.add_argument("--report_seq_len", type=int, default=512,
                 help="the summary's real-token share per source is for rows of this length")
  runtime.add_verbosity_flag(p)
  args = p.parse_args(argv)
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
  opts = prepare.Options(sources=tuple(args.sources), tokenizer=args.tokenizer,
                         doc_format=args.doc_format, eval_percent=args.eval_percent,
                         max_line_bytes=args.max_line_bytes, tfds_data_dir=args.tfds_data_dir,
                         strict=args.strict)
  try:
    manifest = prepare.prepare(opts, args.out, num_workers=args.num_workers,
                               task_index=args.task_index, num_tasks=args.num_tasks,
                               finalize_only=args.finalize, progress_s=args.progress_s)
  except UserError as e:
    runtime.report_user_error(e)
    return 1
  if manifest:
    summary = {k: {f: v[f] for f in ("documents", "tokens", "eval_documents", "shards")}
               for k, v in manifest["sources"].items()}
    for name, share in _real_fractions(args.out, manifest, args.report_seq_len).items():
      summary[name][f"real_fraction_at_{args.report_seq_len}"] = round(share, 4)
    print(json.dumps(summary, sort_keys=True))
  return 0


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
