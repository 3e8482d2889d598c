"""`benchmark.py pll`: pseudo-log-likelihood sentences/s, ours (packed, and one copy per row) against
transformers' PLL (one forward pass per masked copy, copies batched and padded) on the same exported model.

  python tools/benchmark.py pll --workdir=DEMO_WORKDIR [--pairs=10]            # the trained demo model
  python tools/benchmark.py pll --workdir=DEMO_WORKDIR --model=mini            # a random mini-size model, same tokenizer

Sentences: the first `--pairs` pairs of every BLiMP paradigm (both sentences). Each side is timed on its
second pass (the first compiles / warms up); the last line is one JSON object.
"""
import argparse
import json
import os
import sys
import tempfile
import time

from mlm_jax.config.sizes import SIZES


def _parse(argv):
  p = argparse.ArgumentParser(prog="benchmark.py pll")
  p.add_argument("--workdir", required=True, help="a pretraining workdir: its tokenizer (and, without --model, weights)")
  p.add_argument("--model", default="", choices=[""] + sorted(SIZES), help="a random model of this size instead")
  p.add_argument("--pairs", type=int, default=10, help="BLiMP pairs per paradigm")
  p.add_argument("--rows", type=int, default=64, help="our rows per step")
  p.add_argument("--row_len", type=int, default=128)
  p.add_argument("--sentences", type=int, default=0, help="score only the first N sentences (0 = all)")
  p.add_argument("--hf_batch", type=int, default=64, help="transformers: masked copies per forward pass")
  p.add_argument("--data_dir", default="", help="folder holding zeroshot/blimp (default: $MLM_JAX_DATA or ../shared/data)")
  p.add_argument("--skip_transformers", action="store_true")
  return p.parse_args(argv)


def _random_workdir(source: str, size: str, row_len: int, out: str) -> str:
  """OUT: a workdir of a random `size` encoder with SOURCE's tokenizer (for the export)."""
  import shutil
  from flax import nnx
  from mlm_jax.model.encoder import Encoder
  from mlm_jax.workdir import checkpoints
  from mlm_jax.workdir import files as workdir_files
  config = workdir_files.read_config(source)
  os.makedirs(out)
  shutil.copy(workdir_files.tokenizer_path(source, config), os.path.join(out, "spm.model"))
  config.data.tokenizer = os.path.join(out, "spm.model")
  config.model.update(SIZES[size])
  config.model.max_position_embeddings = max(int(config.model.max_position_embeddings), 130)
  ckpt = checkpoints.Checkpointer(out, async_save=False)
  ckpt.save(1, {"params": nnx.state(Encoder(config.model, seed=0), nnx.Param)}, {})
  ckpt.close()
  workdir_files.write_config(config, out)
  return out


def _ours(lm, sentences, args, one_per_row: bool):
  from flax import nnx
  from mlm_jax.evaluation import pll
  graphdef, params = nnx.split(lm.model, nnx.Param)
  scorer = pll.Scorer(graphdef, lm.tokenizer, args.row_len, rows=args.rows, one_per_row=one_per_row,
                      max_len=pll.max_len(lm.model_config))
  scorer(params, sentences[:8])   # compiles (the slot count may differ from the full set's: see below)
  t0 = time.perf_counter()
  packed = scorer.pack(sentences)
  scores = scorer(params, sentences)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  scores = scorer(params, sentences)
  seconds = time.perf_counter() - t0
  fill = packed.real_tokens / packed.segment_ids.size
  return scores, dict(seconds=seconds, first_pass_s=first, rows=len(packed.input_ids), fill=fill,
                      sentences_per_sec=len(sentences) / seconds)


def _transformers(hf_dir, sentences, mask_id, pad_id, batch: int):
  import numpy as np
  import torch
  import transformers
  model = transformers.AutoModelForMaskedLM.from_pretrained(hf_dir).eval()
  copies = [(s, i) for s, seq in enumerate(sentences) for i in range(1, len(seq) - 1)]

  def run():
    total = np.zeros(len(sentences))
    with torch.no_grad():
      for b in range(0, len(copies), batch):
        part = copies[b:b + batch]
        width = max(len(sentences[s]) for s, _ in part)
        ids = torch.full((len(part), width), pad_id, dtype=torch.long)
        att = torch.zeros((len(part), width), dtype=torch.long)
        for r, (s, i) in enumerate(part):
          ids[r, :len(sentences[s])] = torch.tensor(sentences[s])
          att[r, :len(sentences[s])] = 1
          ids[r, i] = mask_id
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits.double(), -1)
        for r, (s, i) in enumerate(part):
          total[s] += float(logp[r, i, sentences[s][i]])
    return total

  run_once = lambda: (lambda t0: (run(), time.perf_counter() - t0))(time.perf_counter())
  run_once()   # warm-up
  scores, seconds = run_once()
  return scores, dict(seconds=seconds, sentences_per_sec=len(sentences) / seconds, batch=batch,
                      torch_threads=torch.get_num_threads())


def _say(message: str) -> None:
  print(f"[pll] {message}", file=sys.stderr, flush=True)


def main(argv):
  args = _parse(argv)
  import numpy as np
  from mlm_jax.convert import folders
  from mlm_jax.evaluation import fill_mask, pll
  from mlm_jax.tasks import blimp, catalogue
  paradigms = blimp.read(blimp.folder(catalogue.data_dir(args.data_dir, need=blimp.FOLDER)), args.pairs)
  with tempfile.TemporaryDirectory() as tmp:
    workdir = _random_workdir(args.workdir, args.model, args.row_len, os.path.join(tmp, "wd")) if args.model \
        else args.workdir
    lm = fill_mask.from_workdir(workdir)
    sentences = pll.encode(lm.tokenizer, [s for p in paradigms for s in p.good + p.bad])
    sentences = sentences[:args.sentences] if args.sentences else sentences
    _say(f"{len(sentences)} sentences, {sum(len(s) - 2 for s in sentences)} masked copies")
    packed_scores, packed = _ours(lm, sentences, args, one_per_row=False)
    _say(f"ours, packed: {packed}")
    _, unpacked = _ours(lm, sentences, args, one_per_row=True)
    _say(f"ours, one copy per row: {unpacked}")
    result = dict(bench="mlm_jax_pll", model=args.model or "workdir", workdir=args.workdir,
                  sentences=len(sentences), tokens=int(sum(len(s) for s in sentences)),
                  masked_copies=int(sum(len(s) - 2 for s in sentences)), params=int(sum(
                      x.size for x in __import__("jax").tree.leaves(__import__("flax").nnx.state(lm.model)))),
                  ours_packed=packed, ours_one_copy_per_row=unpacked)
    if not args.skip_transformers:
      hf_dir = os.path.join(tmp, "hf")
      folders.to_hf(workdir, hf_dir)
      hf_scores, hf = _transformers(hf_dir, sentences, lm.tokenizer.mask_id, lm.tokenizer.pad_id, args.hf_batch)
      _say(f"transformers: {hf}")
      result.update(transformers=hf, speedup_vs_transformers=packed["sentences_per_sec"] / hf["sentences_per_sec"],
                    max_abs_diff_vs_transformers=float(np.max(np.abs(hf_scores - packed_scores))))
  print(json.dumps(result))
