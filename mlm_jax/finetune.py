"""Fine-tuning binary: python -m mlm_jax.finetune --config=configs/finetune/TASK.py --init_from=SRC --workdir=DIR

SRC is a pretraining workdir, a `tools/convert_checkpoint.py from_hf` folder, or a transformers folder
(converted once into DIR/init_model). Flags -> finetuning.finetuner.finetune: provision, resolve, build the task
and its head, run the one loop, score the best checkpoint.
"""
from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from mlm_jax import runtime
from mlm_jax.finetuning import finetuner

_CONFIG = config_flags.DEFINE_config_file("config", None, "Fine-tuning config (configs/finetune/*.py), fields "
                                          "overridable as --config.train.steps=100.", lock_config=True)
_INIT_FROM = flags.DEFINE_string("init_from", None, "Pretraining workdir, from_hf folder or transformers folder "
                                 "(overrides config.init_from).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory: checkpoints, metrics, predictions.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None or not _WORKDIR.value:
    raise app.UsageError("--config and --workdir are required")
  runtime.start()
  finetuner.finetune(_CONFIG.value, _WORKDIR.value, _INIT_FROM.value)


def run():
  """Console-script entry point (`mlm-jax-finetune`)."""
  runtime.run(main)


if __name__ == "__main__":
  run()
