"""The fine-tuning config schema with defaults; every file in configs/finetune/ starts from `finetune_config()`.

No model or tokenizer fields: both come from `init_from`, so a fine-tuned model always matches the
checkpoint it starts from. Optimizer, mesh and sharding are the pretraining sections (defaults.py).
"""
import ml_collections

from mlm_jax.config.defaults import default_config, loop_defaults


def finetune_config() -> ml_collections.ConfigDict:
  base = default_config()
  c = ml_collections.ConfigDict()
  c.kind = "finetuning"          # what the config is for (pretraining configs: "pretraining")
  c.seed = 0
  # Where the encoder comes from (also settable as --init_from): a pretraining workdir (its latest
  # checkpoint, its config.json and tokenizer), a from_hf output folder, or a transformers folder
  # (converted once into WORKDIR/init_model with the folder's sentencepiece model).
  c.init_from = ""
  # Baseline: the same architecture and tokenizer as init_from, but randomly initialized weights.
  c.random_init = False
  c.tokenizer = ""               # override the tokenizer (any file data.tokenizer takes; same vocabulary size)

  t = c.task = ml_collections.ConfigDict()
  t.kind = "classification"      # classification | regression | token | qa
  # Files (globs; .gz read transparently). format 'lines' takes LABEL=GLOB, one file per class.
  t.train_files = ()
  t.eval_files = ()
  t.eval_percent = 10.0          # with no eval_files: hold out this % of train_files by a stable hash
  t.format = "tsv"               # classification/regression: tsv | csv | jsonl | lines | trec (TREC's
                                 # 'COARSE:fine question'); token: conllu (CoNLL-U), anything else = CoNLL
  t.header = False               # tsv/csv: the first row names the columns
  t.text_field = "0"             # column number, header name or JSON key
  t.text_b_field = ""            # second text of sentence pairs ('' = single sentences)
  t.label_field = "1"
  t.labels = ()                  # label names in id order ('' = sorted labels of the training data)
  t.token_column = 0             # token: CoNLL columns of the word and of its tag
  t.tag_column = -1
  t.max_query_length = 64        # qa: question pieces kept
  t.doc_stride = 128             # qa: distance between windows over a long paragraph
  t.max_answer_length = 30       # qa: longest answer, in pieces
  t.max_train_examples = 0       # 0 = all; otherwise a fixed random subset of N (quick runs)
  t.max_eval_examples = 0

  c.seq_len = 128
  c.head_dropout = -1.0          # -1 = the encoder's hidden_dropout
  c.hidden_dropout = -1.0        # -1 = keep the pretrained model's dropout rates
  c.attention_dropout = -1.0

  c.optimizer = base.optimizer
  c.optimizer.update(dict(learning_rate=5e-5, warmup_steps=0, warmup_fraction=0.06, schedule="linear",
                          weight_decay=0.01, clip_norm=1.0))

  r = c.train = loop_defaults()
  r.update(dict(eval_every=200,  # and at the last step
                save_every=500,  # latest checkpoint, for resuming (the best one is kept separately)
                keep_checkpoints=1))
  r.eval_batch_size = 64
  # Which eval metric picks the best checkpoint (higher is better); '' = the task's default:
  # accuracy (classification), pearson (regression), f1 (token: entity F1; qa: SQuAD F1).
  r.best_metric = ""

  c.mesh = base.mesh
  c.sharding = base.sharding
  return c


MODES = ("full", "fast")


def budget(c: ml_collections.ConfigDict, mode: str, fast: dict) -> ml_collections.ConfigDict:
  """`configs/finetune/TASK.py:fast`: the downstream suite's fast budget (fewer steps, shorter
  sequences, capped eval sets), so that a quick check of a checkpoint costs minutes; `full` (the
  default) keeps the file's own budget. `fast` maps config paths ('train.steps', 'seq_len') to values."""
  if mode not in MODES:
    from mlm_jax.errors import ConfigError
    raise ConfigError(f"config argument {mode!r}: expected one of {', '.join(MODES)} (configs/finetune/TASK.py:fast)")
  if mode == "fast":
    for path, value in fast.items():
      section, _, key = path.rpartition(".")
      (c[section] if section else c)[key] = value
  return c
