#!/usr/bin/env python
"""Convert checkpoints between mlm_jax and Hugging Face transformers (BERT / RoBERTa / XLM-R / ModernBERT masked LMs).

  python tools/convert_checkpoint.py to_hf --workdir=DIR [--step=N] --out=HF_DIR [--arch=bert|roberta|xlm-roberta|modernbert]
  python tools/convert_checkpoint.py from_hf --hf_dir=HF_DIR --out=DIR [--tokenizer=spm.model]

to_hf writes a folder that `AutoModelForMaskedLM` / `AutoTokenizer` load with exactly our token ids
(an ELECTRA run: HF_DIR/discriminator and HF_DIR/generator); from_hf writes a workdir that
`--config.init_from` takes and prints the flags that continue pretraining from it. Neither writes
into a non-empty --out unless --overwrite; errors are one line on stderr and exit code 2.
What the folders hold: docs/design_notes.md#toolsconvert_checkpointpy.
"""
import argparse
import json

from mlm_jax import runtime


def _parser():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="command", required=True)
  t = sub.add_parser("to_hf", help="workdir -> transformers folder")
  t.add_argument("--workdir", required=True, help="training workdir (or a from_hf output folder)")
  t.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
  t.add_argument("--out", required=True, help="output folder for the transformers model")
  t.add_argument("--arch", default=None, help="bert | roberta | xlm-roberta | modernbert (default: from the model)")
  t.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
  t.add_argument("--ema", action="store_true", help="export the moving average of the parameters (train.ema_decay)")
  f = sub.add_parser("from_hf", help="transformers folder -> checkpoint for config.init_from")
  f.add_argument("--hf_dir", required=True, help="folder with config.json and model.safetensors")
  f.add_argument("--out", required=True, help="output folder (config.json, checkpoints/0, tokenizer/)")
  f.add_argument("--tokenizer", default=None,
                 help="tokenizer to pair with the weights: .model, tokenizer.json, vocab.txt or a folder "
                 "(default: the folder's own, if any)")
  f.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
  for sub_parser in (t, f):
    runtime.add_verbosity_flag(sub_parser)
  return p


def main(argv=None) -> int:
  a = _parser().parse_args(argv)
  runtime.setup_tool_logging()
  from mlm_jax.convert import folders
  from mlm_jax.errors import UserError
  try:
    if a.command == "to_hf":
      summary = folders.to_hf(a.workdir, a.out, step=a.step, arch=a.arch, overwrite=a.overwrite, ema=a.ema)
      print(f"wrote {a.out} ({summary['arch']}, step {summary['step']}): {', '.join(summary['files'])}")
      if summary.get("note"):
        print(f"note: {summary['note']}")
    else:
      summary = folders.from_hf(a.hf_dir, a.out, tokenizer=a.tokenizer, overwrite=a.overwrite)
      print(f"wrote {a.out} from {summary['weights']} ({summary['arch']})")
      if summary["fresh_head"]:
        print(f"note: {a.hf_dir} has no MLM head (a base model): the head is freshly initialized")
      if summary["tokenizer"] is None:
        print("note: the HF folder has no tokenizer; pass --config.data.tokenizer=PATH with "
              "the same vocabulary size when training")
      print("continue pretraining with:\n  python -m mlm_jax.train --config=CONFIG --workdir=RUN "
            + " ".join(summary["train_flags"]) + " --config.data.sources=...")
    print(json.dumps(summary, sort_keys=True))
  except UserError as e:
    runtime.report_user_error(e)
    return 2
  return 0


if __name__ == "__main__":
  runtime.exit_now(main())
