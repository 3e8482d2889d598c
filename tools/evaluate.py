#!/usr/bin/env python
"""Judge a pretrained model on held-out text: masked-LM loss / accuracy / perplexity and pseudo-log-likelihood.

  python tools/evaluate.py mlm --workdir=DIR --data='held_out/*.txt' [--step=N] [--seq_len=128]
  python tools/evaluate.py mlm --hf_dir=HF_DIR --data=held_out.txt.gz [--against_transformers]

Each non-empty line is a sequence `<s> pieces </s>`. MLM uses the run's masking with a fixed seed, so
checkpoints are compared on the same masks; PLL (mlm_jax/evaluation/pll.py, packed masked copies) covers
the first `--pll_lines` lines (docs/design_notes.md#toolsevaluatepy). Prints one JSON object; errors are
one line on stderr and exit code 2.
"""
import argparse
import json
import math

from mlm_jax import runtime


def _parser():
  from mlm_jax.evaluation import fill_mask
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="command", required=True)
  m = sub.add_parser("mlm", help="masked-LM loss, accuracy, perplexity and pseudo-log-likelihood on text files")
  fill_mask.add_source_flags(m)
  m.add_argument("--data", required=True, help="text files: comma-separated globs, .gz read transparently")
  m.add_argument("--seq_len", type=int, default=128)
  m.add_argument("--batch_size", type=int, default=32)
  m.add_argument("--max_lines", type=int, default=0, help="use only the first N sequences (0 = all)")
  m.add_argument("--pll_lines", type=int, default=50, help="sequences scored by PLL (0 = none)")
  m.add_argument("--pll", default="token", choices=("token", "whole_word", "word_l2r"),
                 help="PLL variant: each piece masked alone (token), each word whole (whole_word), or each piece "
                      "with the rest of its word to the right (word_l2r, Kauf & Ivanova 2023)")
  m.add_argument("--whole_word", action="store_const", const="whole_word", dest="pll", help="--pll=whole_word")
  m.add_argument("--seed", type=int, default=0, help="masking seed")
  m.add_argument("--against_transformers", action="store_true",
                 help="with --hf_dir: also run transformers' AutoModelForMaskedLM on the same masked batches "
                      "(transformers_loss, loss_abs_diff): checks that the import is exact")
  runtime.add_verbosity_flag(m)
  return p


def sequences(tok, paths, seq_len: int, max_lines: int = 0) -> list:
  """`<s> ids </s>` per non-empty line; a line longer than seq_len becomes several sequences."""
  from mlm_jax.tasks import readers
  out, body = [], seq_len - 2
  for path in readers.expand(paths):
    lines = [l.strip() for l in readers.read_text(path).splitlines() if l.strip()]
    for ids in tok.encode_batch(lines):
      for k in range(0, len(ids), body):
        out.append([tok.bos_id] + ids[k:k + body] + [tok.eos_id])
        if max_lines and len(out) >= max_lines:
          return out
  return out


def _pack(rows: list, seq_len: int, pad_id: int, batch_size: int):
  import numpy as np
  n = -(-len(rows) // batch_size) * batch_size
  ids = np.full((n, seq_len), pad_id, np.int32)
  seg = np.zeros((n, seq_len), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
    seg[i, :len(r)] = 1
  pos = np.where(seg > 0, np.arange(seq_len)[None, :], 0).astype(np.int32)
  return ids, seg, pos


def mlm_metrics(lm, kcfg, rows: list, seq_len: int, batch_size: int, seed: int, hf_model=None) -> dict:
  """The held-out evaluator of pretraining (evaluation/heldout.py: the MLM objective's eval step summed
  with masks from one fixed key of `seed`) over all rows, on one device. `hf_model` (a transformers
  masked LM) is scored on the same corrupted batches with labels at the masked positions, as its own
  loss computes it."""
  import jax
  import ml_collections
  from flax import nnx
  from mlm_jax.evaluation import heldout
  from mlm_jax.objectives.mlm import MLMStep
  graphdef, params = nnx.split(lm.model, nnx.Param)
  mlm = MLMStep(ml_collections.ConfigDict(dict(masking=kcfg, model=dict(vocab_size=lm.model_config.vocab_size),
                                               loss=dict(z_loss=0.0))))   # metrics, no training loss
  eval_step = jax.jit(lambda params, batch, key, values: mlm.evaluate(nnx.merge(graphdef, params), batch, key,
                                                                      values=values))
  key = heldout.eval_key(seed)
  ids, seg, pos = _pack(rows, seq_len, lm.tokenizer.pad_id, batch_size)
  batches = [dict(input_ids=ids[b:b + batch_size], segment_ids=seg[b:b + batch_size], positions=pos[b:b + batch_size])
             for b in range(0, len(ids), batch_size)]
  sums = heldout.summed(mlm, eval_step, params, batches, key)
  rates = heldout.rates(mlm, sums)
  out = dict(loss=rates["eval_loss"], accuracy=rates["eval_accuracy"], perplexity=rates["eval_perplexity"],
             num_predictions=int(sums["num_predictions"]))
  hf_sum = 0.0
  if hf_model is not None:
    mask_fn = jax.jit(mlm.prepare)
    for batch in batches:
      hf_sum += _transformers_loss_sum(hf_model, jax.device_get(mask_fn(batch, key)))
  if hf_model is not None:
    out["transformers_loss"] = hf_sum / max(out["num_predictions"], 1)
    out["loss_abs_diff"] = abs(out["transformers_loss"] - out["loss"])
  return out


def _transformers_loss_sum(model, masked) -> float:
  """Summed cross-entropy of a transformers masked LM over the masked slots of one corrupted batch."""
  import numpy as np
  import torch
  ids = np.asarray(masked["input_ids"], np.int64)
  labels = np.full(ids.shape, -100, np.int64)
  w = np.asarray(masked["masked_weights"]) > 0
  labels[np.nonzero(w)[0], np.asarray(masked["masked_positions"])[w]] = np.asarray(masked["masked_labels"])[w]
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(np.asarray(masked["segment_ids"]) > 0),
                labels=torch.tensor(labels))
  return float(out.loss) * int(w.sum())


def pseudo_log_likelihood(lm, rows: list, seq_len: int, batch_size: int, variant: str = "token") -> dict:
  """Sum over tokens (BOS/EOS excluded) of log p(token | the rest), the copies packed (evaluation/pll.py)."""
  from flax import nnx
  from mlm_jax.evaluation import pll
  graphdef, params = nnx.split(lm.model, nnx.Param)
  scorer = pll.Scorer(graphdef, lm.tokenizer, seq_len, rows=batch_size, variant=variant, shift=lm.shift)
  per_row = scorer(params, rows)
  total, count = float(per_row.sum()), sum(len(r) - 2 for r in rows)
  per = total / max(count, 1)
  return dict(pll=total, pll_tokens=count, pll_sequences=len(rows), pll_per_token=per, pseudo_perplexity=math.exp(-per),
              pll_variant=variant)


def evaluate_mlm(workdir=None, hf_dir=None, data="", step=None, tokenizer=None, seq_len=128, batch_size=32,
                 max_lines=0, pll_lines=50, seed=0, against_transformers=False, pll="token") -> dict:
  from mlm_jax.config.defaults import default_config
  from mlm_jax.errors import UserError
  from mlm_jax.evaluation import fill_mask
  from mlm_jax.training import resolve
  from mlm_jax.workdir import files as workdir_files
  lm = fill_mask.load(workdir=workdir, hf_dir=hf_dir, step=step, tokenizer=tokenizer)
  resolve.check_positions(lm.model_config, seq_len, "--seq_len")
  kcfg = default_config().masking
  if workdir:
    run = workdir_files.config_at(workdir, step)
    if run.kind == "pretraining":
      kcfg.update({k: v for k, v in run.masking.to_dict().items() if k in kcfg})
  tok = lm.tokenizer
  resolve.bind_masking_ids(kcfg, tok)
  rows = sequences(tok, [p for p in data.split(",") if p], seq_len, max_lines)
  if not rows:
    raise UserError(f"--data={data}: no text lines")
  out = dict(source=lm.source, data=data, sequences=len(rows))
  hf_model = None
  if against_transformers:
    if not hf_dir:
      raise UserError("--against_transformers needs --hf_dir (the folder transformers loads)")
    import transformers
    hf_model = transformers.AutoModelForMaskedLM.from_pretrained(hf_dir).eval()
  out.update(mlm_metrics(lm, kcfg, rows, seq_len, batch_size, seed, hf_model))
  if pll_lines:
    out.update(pseudo_log_likelihood(lm, rows[:pll_lines], seq_len, batch_size, pll))
  return out


def main(argv=None) -> int:
  a = _parser().parse_args(argv)
  runtime.setup_tool_logging()
  from mlm_jax.errors import UserError
  try:
    result = evaluate_mlm(workdir=a.workdir, hf_dir=a.hf_dir, data=a.data, step=a.step, tokenizer=a.tokenizer,
                          seq_len=a.seq_len, batch_size=a.batch_size, max_lines=a.max_lines, pll_lines=a.pll_lines,
                          seed=a.seed, against_transformers=a.against_transformers,
                          pll=a.pll)
  except UserError as e:
    runtime.report_user_error(e)
    return 2
  print(json.dumps(result, sort_keys=True))
  return 0


if __name__ == "__main__":
  runtime.choose_allocator()   # on CPU: re-executes under mimalloc (mlm_jax/runtime/allocator.py), before jax is imported
  runtime.exit_now(main())
