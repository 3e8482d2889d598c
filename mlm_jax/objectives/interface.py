"""What an objective is: the page to read before adding one.

An objective has two parts:

- its description (`Description`, a class of class methods): what the rest of the code asks before or
  after a run: config checks, the input and batch features it needs, FLOPs per token, its model and
  which subtree is the encoder, and which exporter of convert/folders.py writes it (`export_kind`). The
  defaults are the masked LM's, so a new objective answers only what it changes, and names its step.
- its step (`Step`): an instance made by the trainer from the frozen config; its `prepare` ->
  `loss_sums` run in the jitted train step, `evaluate` in the eval step, `summarize` and `console` on
  the host. Subclass objectives.mlm.MLMStep and override what differs.

Register the description: one line in registry.py, or `--config.objective=module:Class`.
"""
from __future__ import annotations

from typing import Any, ClassVar, Protocol

import ml_collections

from mlm_jax.errors import ConfigError
from mlm_jax.model import flops
from mlm_jax.model.encoder import Encoder

Config = ml_collections.ConfigDict
ROW_FEATURES = ("input_ids", "segment_ids", "positions", "word_starts")   # a packed row (data/)


class Step(Protocol):
  """What the jitted steps call (built by make_trainer from the frozen config)."""
  count_key: str
  """The summed metric that divides the gradient: the loss is a mean over it for the global batch."""

  def __init__(self, config: Config): ...

  def prepare(self, batch: dict, key, step=None, values=None) -> dict:
    """The on-device input transform (masking), inside the jitted step; `step` is None at eval. `values`:
    the step's StepValues (config/step_values.py: the mask rate), None outside a trainer's step."""

  def loss_sums(self, model, batch: dict, dropout_key, activation_sharding=None, values=None) -> tuple[Any, dict]:
    """(summed loss, summed metrics) of a (micro)batch; the step divides by sums[count_key]. `values`
    goes to the model's calls (`step_values=`: RoPE theta)."""

  def evaluate(self, model, batch: dict, key, activation_sharding=None, values=None) -> dict:
    """The eval step's output (summed metrics), masks from `key`, fixed across evaluations."""

  def summarize(self, sums: dict) -> dict:
    """Host-side rates (loss, accuracy, ...) from summed metrics, for the log and TensorBoard;
    an optional `summarize_eval` adds what only the held-out evaluation reports (perplexity)."""

  def console(self, rates: dict) -> str:
    """The objective's part of the console line."""

  # Optional: schedule_values(step) -> dict of curriculum values at `step`, logged with the rates.


class Description:
  """The questions asked of an objective before or after a run, answered as the masked LM does (class
  methods; the config is the resolved, still-editable one). `step` alone has no default."""
  step: ClassVar[type]
  """The Step class the trainer makes from the frozen config."""
  input_kind: ClassVar[str] = "rows"
  """'rows' (packed documents), 'nsp_pairs' or 'sop_pairs' (sentence pairs from a token store)."""
  prediction_shift: ClassVar[int] = 0
  """Where the masked LM predicts a masked token at position t: from t - prediction_shift (MLM: 0; GPT-BERT's
  masked next-token prediction: 1). Pseudo-log-likelihood, fill-mask and to_hf's config.json follow it."""
  export_kind: ClassVar[str] = "masked_lm"
  """Which exporter of convert/folders.py (`EXPORTERS`) writes a run as transformers folder(s): 'masked_lm'
  the `encoder` as a BERT / RoBERTa / XLM-R / ModernBERT masked LM, 'electra' the two ELECTRA towers."""

  @classmethod
  def bind(cls, config: Config) -> None:
    """Derive the fields the objective implies (NSP: model.use_pooler / sentence_head), in resolve.py."""

  @classmethod
  def check(cls, config: Config) -> None:
    """Raise a one-line ConfigError for a config the objective cannot train (or export)."""
    if not config.model.mlm_head:
      raise ConfigError(f"model.mlm_head=False (an ELECTRA discriminator): objective={config.objective!r} needs "
                        "the MLM head; fine-tune it with mlm_jax.finetune instead")

  @classmethod
  def towers(cls, config: Config) -> dict[str, Config]:
    """Model configs the step runs besides config.model, by a name for messages (ELECTRA's generator):
    the attention kernel chosen for the platform must serve them too."""
    return {}

  @classmethod
  def batch_features(cls, seq_len: int) -> dict[str, tuple]:
    """Every int32 feature of an input row and its shape per row: the AOT tool's abstract batch and
    the eval step's all-padding filler rows are made from it."""
    return {k: (seq_len,) for k in ROW_FEATURES}

  @classmethod
  def flops_per_token(cls, config: Config, seq_len: int, num_slots: int) -> float:
    """Model FLOPs of one training step per input token (the MFU numerator; see flops.py)."""
    return flops.flops_per_token(config.model, seq_len, num_slots)

  @classmethod
  def make_model(cls, config: Config) -> Any:
    """The nnx.Module whose Params the train state holds."""
    return Encoder(config.model, seed=config.seed)

  @classmethod
  def encoder(cls, config: Config) -> tuple[str, Config]:
    """(path of the encoder in make_model's module, '' = itself; its model config): what init_from,
    fine-tuning and the 'masked_lm' export start from."""
    return "", config.model

  @classmethod
  def masked_lm(cls, config: Config) -> tuple[str, Config]:
    """(path, model config) of the tower with an MLM head, which fill-mask runs."""
    return "", config.model
