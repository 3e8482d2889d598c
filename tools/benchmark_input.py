#!/usr/bin/env python
"""Input-pipeline throughput: text files -> ready packed batches, in tokens per second.

  python tools/benchmark_input.py                      # English Gutenberg books of ../shared/data
  python tools/benchmark_input.py --input='en=corpus/en/leipzig/*.gz' --doc_format=line
  python tools/benchmark.py input [same flags]
  python tools/benchmark_input.py --store=DIR          # a token store (tools/prepare_data.py)

Times the real streaming Pipeline (or, with --store, the store pipeline and its resume; with
--prepare_workers, prepare itself) beside a transformers run_mlm.py-style peer in the same run. The
last line is one JSON object; its fields: docs/design_notes.md#toolsbenchmark_inputpy.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import mlm_jax  # noqa: F401  (its import sets the process up before jax or TensorFlow is imported)

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DATA = os.environ.get("MLM_JAX_DATA", os.path.join(os.path.dirname(_REPO), "shared", "data"))
DEFAULT_INPUT = os.path.join(_DATA, "corpus/en/gutenberg_kalamine/*.txt.gz")
# A 32k vocabulary needs more text than the benchmark input: all English of ../shared/data.
TOKENIZER_TEXT = (f"en={DEFAULT_INPUT}", os.path.join(_DATA, "corpus/en/gutenberg_nltk/*.txt.gz"),
                  "tsv:1:" + os.path.join(_DATA, "corpus/en/leipzig/*.txt.gz"))


def _tokenizer(args, inputs):
  from mlm_jax.data.tokenizers import load as tokenizer_load
  from mlm_jax.data.tokenizers import spm_training
  if args.tokenizer:
    return tokenizer_load.load(args.tokenizer)
  cache = os.path.join(tempfile.gettempdir(), f"mlm_jax_bench_spm_{args.vocab_size}")
  if os.path.exists(cache + ".model"):
    return tokenizer_load.load(cache + ".model")
  t0 = time.perf_counter()
  text = TOKENIZER_TEXT if list(inputs) == [f"en={DEFAULT_INPUT}"] else list(inputs)
  tok = spm_training.train({f"t{i}": t.split("=", 1)[-1] for i, t in enumerate(text)}, cache, vocab_size=args.vocab_size, alpha=1.0,
                              max_sentences_per_language=200_000, input_sentence_size=300_000,
                              verbose=False)
  print(f"trained tokenizer {cache}.model in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
  return tok


def _bench_pipeline(args, cfg, tok):
  from mlm_jax.data.text import stream
  t0 = time.perf_counter()
  it = stream.Pipeline(cfg, tok, args.batch_size, seed=0)
  for _ in range(args.warmup):
    next(it)
  warm_s = time.perf_counter() - t0
  real = 0
  t0 = time.perf_counter()
  for _ in range(args.batches):
    b = next(it)
    real += int((b["segment_ids"] > 0).sum())
  dt = time.perf_counter() - t0
  slots = args.batches * args.batch_size * cfg.seq_len
  return dict(tokens_per_sec=slots / dt, real_tokens_per_sec=real / dt,
              batches_per_sec=args.batches / dt, timed_batches=args.batches,
              timed_s=dt, warmup_s=warm_s, fill=real / slots, stats=it.stats(),
              real_fraction_by_source=_real_by_source(args, cfg, tok))


def _real_by_source(args, cfg, tok) -> dict:
  """The share of row slots that hold a real token, per source, over --batches batches (untimed)."""
  import numpy as np
  from mlm_jax.data.text import stream, sources
  names = [src.name for src in sources.parse_sources(cfg.sources, cfg.tfds_data_dir)]
  ds = stream.build_dataset(cfg, tok, args.batch_size, seed=0, with_source=True).take(args.batches)
  real, rows = np.zeros(len(names)), np.zeros(len(names))
  for b in ds.as_numpy_iterator():
    np.add.at(real, b["source"], (b["segment_ids"] > 0).sum(axis=1))
    np.add.at(rows, b["source"], 1)
  return {n: float(r / (k * cfg.seq_len)) for n, r, k in zip(names, real, rows) if k}


def _bench_store(args, cfg):
  """The store pipeline built in this process, and (--store_workers=N) in N worker processes."""
  from mlm_jax.data.store import loader
  cfg = cfg.copy_and_resolve_references()
  cfg.sources = (f"store:{args.store}",)
  out = {}
  for workers in sorted({0, args.store_workers}):
    cfg.store_workers = workers
    t0 = time.perf_counter()
    it = loader.StorePipeline(cfg, args.batch_size, seed=0)
    build_s = time.perf_counter() - t0
    for _ in range(3 + 2 * workers):   # workers start (a second or so) and fill their queue
      next(it)
    real, t0 = 0, time.perf_counter()
    for _ in range(args.batches):
      real += int((next(it)["segment_ids"] > 0).sum())
    dt = time.perf_counter() - t0
    slots = args.batches * args.batch_size * cfg.seq_len
    tag = "store" if workers == 0 else f"store_{workers}_workers"
    out.update({f"{tag}_tokens_per_sec": slots / dt, f"{tag}_real_tokens_per_sec": real / dt})
    if workers == 0:
      state, resume = it.get_state(), {}
      for b in (0, 10**4, 10**6):
        t0 = time.perf_counter()
        fresh = loader.StorePipeline(cfg, args.batch_size, seed=0)
        fresh.set_state(dict(state, rows=b * args.batch_size))
        next(fresh)
        resume[f"batch_{b}"] = time.perf_counter() - t0
      out.update(store_index_build_s=build_s, store_resume_first_batch_s=resume,
                 store_real_fraction_by_source={k: v["real_fraction"] for k, v in it.stats()["sources"].items()})
  return out


def _documents(cfg) -> list:
  """The benchmark input's documents as strings, in memory (what the peers are given)."""
  from mlm_jax.data.text import sources
  docs = []
  for src in sources.parse_sources(cfg.sources):
    ds = src.documents(doc_format=cfg.doc_format)
    docs += [d.decode("utf-8") for d in sources.numpy_elements(ds)]
  return docs


def _bench_prepare(args, cfg, tok):
  """tools/prepare_data.py's work on the benchmark input with 1 and --prepare_workers workers (the
  whole run: reading, tokenizing, hashing the held-out split, writing shards), beside
  sentencepiece's own encode of the same documents already in memory."""
  from mlm_jax.data.store import prepare
  docs = _documents(cfg)
  out = {}
  if tok.family == "sentencepiece":
    for threads in (1, os.cpu_count() or 1):
      t0, n = time.perf_counter(), 0
      for i in range(0, len(docs), 4096):
        n += sum(map(len, tok.processor.encode(docs[i:i + 4096], num_threads=threads)))
      out[f"sentencepiece_encode_{threads}_threads_tokens_per_sec"] = n / (time.perf_counter() - t0)
  for workers in sorted({1, args.prepare_workers}):
    with tempfile.TemporaryDirectory() as root:
      opts = prepare.Options(sources=tuple(cfg.sources), tokenizer=tok.model_path, doc_format=cfg.doc_format,
                             eval_percent=1.0)
      t0 = time.perf_counter()
      manifest = prepare.prepare(opts, os.path.join(root, "store"), num_workers=workers, progress_s=1e9,
                                 log=lambda line: None)
      dt = time.perf_counter() - t0
    tokens = sum(v["tokens"] + v["eval_tokens"] for v in manifest["sources"].values())
    out[f"prepare_{workers}_workers_tokens_per_sec"] = tokens / dt
    out[f"prepare_{workers}_workers_s"] = dt
  out["prepare_tokens"] = tokens
  return out


def _bench_peer(args, cfg, tok):
  """sentencepiece encode loop + group into blocks + DataCollatorForLanguageModeling."""
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  import torch
  import transformers
  from tokenizers import Tokenizer as HFTokenizer
  from tokenizers.models import WordLevel
  transformers.logging.set_verbosity_error()

  docs = _documents(cfg)
  vocab = {tok.id_to_piece(i): i for i in range(tok.vocab_size)}
  names = dict(pad_token=tok.id_to_piece(tok.pad_id), unk_token=tok.id_to_piece(tok.unk_id),
               cls_token=tok.id_to_piece(tok.bos_id), sep_token=tok.id_to_piece(tok.eos_id),
               mask_token=tok.id_to_piece(tok.mask_id))
  hf_tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=HFTokenizer(WordLevel(vocab, unk_token=names["unk_token"])), **names)
  collator = transformers.DataCollatorForLanguageModeling(
      tokenizer=hf_tok, mlm=True, mlm_probability=0.15, return_tensors="pt")
  s, bsz = cfg.seq_len, args.batch_size
  special = set(tok.special_ids)

  def batches():
    buf, examples, i = [], [], 0
    while True:
      ids = tok.encode(docs[i % len(docs)])
      i += 1
      buf.extend([tok.bos_id] + ids + [tok.eos_id])
      while len(buf) >= s:
        block, buf = buf[:s], buf[s:]
        examples.append(dict(input_ids=block, special_tokens_mask=[int(t in special) for t in block]))
        if len(examples) == bsz:
          yield collator(examples)
          examples = []

  gen = batches()
  for _ in range(3):
    next(gen)
  n, t0 = 0, time.perf_counter()
  while time.perf_counter() - t0 < args.peer_seconds:
    b = next(gen)
    n += 1
  dt = time.perf_counter() - t0
  assert tuple(b["input_ids"].shape) == (bsz, s) and isinstance(b["input_ids"], torch.Tensor)
  return dict(tokens_per_sec=n * bsz * s / dt, timed_batches=n, torch_threads=torch.get_num_threads(),
              transformers=transformers.__version__)


def main(argv=None):
  p = argparse.ArgumentParser(prog="benchmark.py input", description=__doc__.split("\n")[0])
  p.add_argument("--input", action="append", help=f"name=spec, repeatable (default en={DEFAULT_INPUT})")
  p.add_argument("--doc_format", default="blank_line", choices=("line", "blank_line"))
  p.add_argument("--packing", default="segmented", choices=("segmented", "concat"))
  p.add_argument("--tokenizer", default="", help="tokenizer (.model, tokenizer.json, vocab.txt or a folder); "
                 "default: train a sentencepiece model (cached in /tmp)")
  p.add_argument("--vocab_size", type=int, default=32000)
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--warmup", type=int, default=50, help="batches before timing")
  p.add_argument("--batches", type=int, default=300, help="batches timed")
  p.add_argument("--shuffle_buffer", type=int, default=10000)
  p.add_argument("--threads", type=int, default=0, help="tf.data private threadpool (0 = TF's)")
  p.add_argument("--num_parallel_calls", type=int, default=-1)
  p.add_argument("--tokenize_batch", type=int, default=128)
  p.add_argument("--prefetch", type=int, default=4)
  p.add_argument("--peer_seconds", type=float, default=10.0)
  p.add_argument("--no_peer", action="store_true")
  p.add_argument("--store", default="", help="also time this token store (and its resume)")
  p.add_argument("--prepare_workers", type=int, default=0,
                 help="also time tools/prepare_data.py on the input with 1 and this many workers (0: not)")
  p.add_argument("--store_workers", type=int, default=2,
                 help="with --store: also time it with this many worker processes (data.store_workers)")
  args = p.parse_args(argv)

  from mlm_jax.config import defaults
  from mlm_jax.data.text import stream
  inputs = args.input or [f"en={DEFAULT_INPUT}"]
  cfg = defaults.data_defaults()
  cfg.update(dict(sources=tuple(inputs), doc_format=args.doc_format, packing=args.packing,
                  seq_len=args.seq_len, shuffle_buffer=args.shuffle_buffer, threads=args.threads,
                  num_parallel_calls=args.num_parallel_calls, tokenize_batch=args.tokenize_batch,
                  prefetch=args.prefetch, eval_percent=0.0))
  tok = _tokenizer(args, inputs)
  result = dict(bench="input", inputs=list(inputs), doc_format=args.doc_format,
                packing=args.packing, seq_len=args.seq_len, batch_size=args.batch_size,
                vocab_size=tok.vocab_size, cpu_count=os.cpu_count(),
                thread_settings=stream.thread_settings(cfg))
  r = _bench_pipeline(args, cfg, tok)
  result.update(r)
  if args.store:
    result.update(_bench_store(args, cfg))
    for k in [k for k in result if k.startswith("store") and k.endswith("_tokens_per_sec") and "real" not in k]:
      result[k[:-len("_tokens_per_sec")] + "_speedup_vs_streaming"] = result[k] / result["tokens_per_sec"]
  if args.prepare_workers:
    result.update(_bench_prepare(args, cfg, tok))
  if not args.no_peer:
    peer = _bench_peer(args, cfg, tok)
    result["peer_hf_collator_tokens_per_sec"] = peer.pop("tokens_per_sec")
    result["peer_hf_collator"] = peer
    result["speedup_vs_peer"] = result["tokens_per_sec"] / result["peer_hf_collator_tokens_per_sec"]
  print(json.dumps(result, sort_keys=True, default=str))
  return 0


if __name__ == "__main__":
  sys.exit(main())
