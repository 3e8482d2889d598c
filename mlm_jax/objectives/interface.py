"""What an objective is: the page to read before adding one.

An objective is a class: `make_trainer` runs its `prepare` -> `loss_sums` in the jitted step, and its
class methods answer the questions asked before or after a run. Subclass `objectives.mlm.MLM` and
override what differs; add one line to registry.py, or pass `--config.objective=module:Class`.
"""
from __future__ import annotations

from typing import Any, ClassVar, Protocol

import ml_collections

Config = ml_collections.ConfigDict


class Objective(Protocol):
  # --- asked before the run (class methods; the config is the resolved, still-editable one) ---
  input_kind: ClassVar[str]
  """'rows' (packed documents), 'nsp_pairs' or 'sop_pairs' (sentence pairs from a token store)."""
  prediction_shift: ClassVar[int]
  """Where the masked LM predicts a masked token at position t: from t - prediction_shift (MLM: 0; GPT-BERT's
  masked next-token prediction: 1). Pseudo-log-likelihood, fill-mask and to_hf's config.json follow it."""

  @classmethod
  def bind(cls, config: Config) -> None:
    """Derive the fields the objective implies (NSP: model.use_pooler / sentence_head), in resolve.py."""

  @classmethod
  def check(cls, config: Config) -> None:
    """Raise a one-line ConfigError for a config the objective cannot train (or export)."""

  @classmethod
  def towers(cls, config: Config) -> dict[str, Config]:
    """Model configs the step runs besides config.model, by a name for messages (ELECTRA's generator):
    the attention kernel chosen for the platform must serve them too."""

  @classmethod
  def batch_features(cls, seq_len: int) -> dict[str, tuple]:
    """Every int32 feature of an input row and its shape per row: the AOT tool's abstract batch and
    the eval step's all-padding filler rows are made from it."""

  @classmethod
  def flops_per_token(cls, config: Config, seq_len: int, num_slots: int) -> float:
    """Model FLOPs of one training step per input token (the MFU numerator; see flops.py)."""

  @classmethod
  def make_model(cls, config: Config) -> Any:
    """The nnx.Module whose Params the train state holds."""

  @classmethod
  def encoder(cls, config: Config) -> tuple[str, Config]:
    """(path of the encoder in make_model's module, '' = itself; its model config): what init_from and
    fine-tuning start from."""

  @classmethod
  def masked_lm(cls, config: Config) -> tuple[str, Config]:
    """(path, model config) of the tower with an MLM head, which fill-mask runs."""

  @classmethod
  def to_hf(cls, workdir: str, out: str, step: int | None, arch: str | None, ema: bool = False) -> dict | None:
    """Export WORKDIR (`ema`: the moving average of its parameters) as transformers folder(s) and return the
    summary; None: export `encoder` as a BERT / RoBERTa / XLM-R / ModernBERT masked LM (convert/folders.py)."""

  # --- the step (an instance, built by make_trainer from the frozen config) ---
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
