#!/usr/bin/env python
"""Top-k predictions for each <mask> in a text, from a training workdir or a transformers folder.

  python tools/fill_mask.py --workdir=DIR "The <mask> of the list is returned." --top_k=5
  python tools/fill_mask.py --hf_dir=HF_DIR "Paris is the <mask> of France." --json

Write `<mask>` (or the tokenizer's own, `[MASK]` for BERT-layout vocabularies) where a token should be
predicted. --hf_dir runs our JAX model on the converted weights, not torch; an ELECTRA run uses its
generator. Prints a table per mask, or one JSON object with --json (docs/design_notes.md#toolsfill_maskpy);
errors are one line on stderr and exit code 2.
"""
import argparse
import json

from mlm_jax import runtime


def _table(result) -> str:
  lines = [f"text: {result['text']}"]
  for n, m in enumerate(result["masks"], start=1):
    lines.append(f"mask {n} (token {m['position']}):")
    lines.append(f"  {'rank':>4}  {'token':<20} {'id':>7}  probability")
    for r, p in enumerate(m["predictions"], start=1):
      lines.append(f"  {r:>4}  {p['token']!r:<20} {p['id']:>7}  {p['probability']:.6f}")
  return "\n".join(lines)


def main(argv=None) -> int:
  from mlm_jax.evaluation import fill_mask
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("text", nargs="+", help="text with one or more <mask>")
  fill_mask.add_source_flags(p)
  p.add_argument("--top_k", type=int, default=5)
  p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
  runtime.add_verbosity_flag(p)
  a = p.parse_args(argv)
  if a.top_k < 1:
    p.error("--top_k must be >= 1")

  runtime.setup_tool_logging()
  from mlm_jax.errors import UserError
  try:
    lm = fill_mask.load(workdir=a.workdir, hf_dir=a.hf_dir, step=a.step, tokenizer=a.tokenizer)
    results = [fill_mask.fill_mask(lm, t, a.top_k) for t in a.text]
  except UserError as e:
    runtime.report_user_error(e)
    return 2
  if a.json:
    print(json.dumps(dict(source=lm.source, results=results), ensure_ascii=False))
  else:
    print(f"model: {lm.source}")
    print("\n\n".join(_table(r) for r in results))
  return 0


if __name__ == "__main__":
  runtime.exit_now(main())
