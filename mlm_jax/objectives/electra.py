"""ELECTRA (Clark et al., 2020, arXiv:2003.10555): replaced-token detection, `config.objective='electra'`.

One jitted step trains both towers: generator MLM on the masked slots, Gumbel-max replacements, then
the discriminator's BCE on every real token (loss = MLM + electra.disc_weight x BCE). The model is
electra_model.py; the discriminator is the encoder, the generator the masked LM; to_hf writes both
(convert/electra_towers.py, the exporter of `export_kind` "electra").
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from mlm_jax.model import flops, encoder
from mlm_jax.objectives import masking
from mlm_jax.errors import ConfigError
from mlm_jax.objectives import sparse_loss
from mlm_jax.objectives.electra_model import (ElectraPair, corrupt, discriminator_config, generator_config,
                                             sample_slots)
from mlm_jax.objectives.interface import Description
from mlm_jax.objectives.mlm import MLMStep


# The discriminator's held-out AUC comes from histograms of its logits (fixed bins, summed on device
# like every metric, as int32 counts): 1024 bins over [-8, 8] (outside: the end bins) resolve logit differences of
# 1/64; two scores in one bin count as a tie (half), so the AUC is exact up to that resolution.
AUC_BINS, AUC_RANGE = 1024, 8.0


def logit_histogram(logits, weights):
  """[AUC_BINS] int32 counts of `logits` (where `weights`, a 0/1 mask, is 1) in fixed bins over
  [-AUC_RANGE, AUC_RANGE]: integers, so the sums over an evaluation stay exact (float32 is not past 2^24)."""
  scaled = (logits.astype(jnp.float32) + AUC_RANGE) * (AUC_BINS / (2 * AUC_RANGE))
  bins = jnp.clip(jnp.floor(scaled), 0, AUC_BINS - 1).astype(jnp.int32)
  return jnp.zeros((AUC_BINS,), jnp.int32).at[bins.reshape(-1)].add(weights.reshape(-1).astype(jnp.int32))


def histogram_auc(positive, negative) -> float:
  """P(score of a positive > score of a negative) (+ half the ties) from two histograms on the same bins."""
  positive, negative = np.asarray(positive, np.float64), np.asarray(negative, np.float64)
  below = np.cumsum(negative) - negative   # negatives in lower bins
  pairs = positive.sum() * negative.sum()
  return float((positive * (below + 0.5 * negative)).sum() / pairs) if pairs else float("nan")


class ElectraStep(MLMStep):
  """The ELECTRA step: MLM's masking, the generator's MLM loss, the discriminator's BCE.

  The gradient is divided by the global number of prediction slots (`count_key`); the
  discriminator's summed loss enters scaled by slots / real tokens of the batch, so the total is
  mean MLM + disc_weight x mean BCE exactly for the whole batch (with gradient accumulation, each
  microbatch's ratio stands in for the global one).
  """
  count_key = "num_predictions"

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    self.disc_weight = float(config.electra.disc_weight)

  def prepare(self, batch, key, step=None, values=None):
    """MLM's masking (at the step's or the scheduled mask rate for `step`) plus per-example sampling seeds."""
    mask_key, sample_key = jax.random.split(key)
    out = masking.mask_batch(batch, mask_key, self.masking, self.vocab_size, rate=self.mask_rate_at(step, values))
    rows = jnp.arange(batch["input_ids"].shape[0])
    out["original_ids"] = batch["input_ids"]
    out["sample_seeds"] = jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(sample_key, i)))(rows)
    return out

  def forward(self, pair: ElectraPair, batch, dropout_key=None, activation_sharding=None, values=None):
    """Everything the loss needs, as a dict (also what the tests compare with transformers)."""
    gen, disc = pair.generator, pair.discriminator
    gen_key = disc_key = None
    if dropout_key is not None:
      gen_key, disc_key = jax.random.split(dropout_key)
    seg, pos, tt = batch["segment_ids"], batch["positions"], batch.get("token_type_ids")
    hidden = gen(batch["input_ids"], seg, pos, tt, dropout_key=gen_key, activation_sharding=activation_sharding,
                 step_values=values)
    y = gen.mlm_transform(sparse_loss.gather_slots(hidden, batch["masked_positions"]))
    mlm = sparse_loss.mlm_sums(y, gen.word_embeddings[...], gen.decoder_bias[...], batch["masked_labels"],
                              batch["masked_weights"], gen.matmul_mode)
    # The sampling logits again, without gradient (the loss's custom VJP keeps its own).
    logits = jnp.einsum("bph,vh->bpv", jax.lax.stop_gradient(y),
                        jax.lax.stop_gradient(gen.word_embeddings[...]).astype(y.dtype),
                        preferred_element_type=jnp.float32)
    logits = logits + jax.lax.stop_gradient(gen.decoder_bias[...]).astype(jnp.float32)
    sampled = sample_slots(logits, batch["sample_seeds"])
    corrupted, replaced = corrupt(batch["original_ids"], batch["masked_positions"], batch["masked_weights"], sampled)
    real = (seg != 0).astype(jnp.float32)
    labels = replaced.astype(jnp.float32) * real
    hidden_d = disc(corrupted, seg, pos, tt, dropout_key=disc_key, activation_sharding=activation_sharding,
                    step_values=values)
    disc_logits = pair.rtd_head(hidden_d, disc.dtype)
    bce = optax.sigmoid_binary_cross_entropy(disc_logits, labels)
    said = (disc_logits > 0).astype(jnp.float32) * real   # "replaced", at threshold 0
    correct = (said == labels).astype(jnp.float32)
    slot_weights = batch["masked_weights"].astype(jnp.float32)
    sampled_correct = (sampled == batch["masked_labels"]).astype(jnp.float32) * slot_weights
    sums = dict(mlm, disc_loss_sum=(bce * real).sum(), disc_correct_sum=(correct * real).sum(), num_tokens=real.sum(),
                replaced_sum=labels.sum(), disc_true_positive_sum=(said * labels).sum(), disc_said_replaced_sum=said.sum(),
                sampled_correct_sum=sampled_correct.sum())
    return dict(sums=sums, sampled=sampled, corrupted=corrupted, labels=labels, disc_logits=disc_logits, real=real)

  def loss_sums(self, pair, batch, dropout_key, activation_sharding=None, values=None):
    sums = self.forward(pair, batch, dropout_key, activation_sharding, values)["sums"]
    ratio = jax.lax.stop_gradient(sums["num_predictions"] / jnp.maximum(sums["num_tokens"], 1.0))
    return self.lm_loss(sums) + self.disc_weight * ratio * sums["disc_loss_sum"], sums

  def evaluate(self, pair, batch, key, activation_sharding=None, values=None):
    """The step's sums plus histograms of the discriminator's logits on replaced and on kept tokens,
    from which `summarize_eval` computes the AUC (held-out evaluations add them up exactly)."""
    out = self.forward(pair, self.prepare(batch, key, None, values), None, activation_sharding, values)
    replaced, kept = out["labels"], out["real"] * (1.0 - out["labels"])
    return dict(out["sums"], disc_logit_hist_replaced=logit_histogram(out["disc_logits"], replaced),
                disc_logit_hist_kept=logit_histogram(out["disc_logits"], kept))

  def summarize(self, sums) -> dict:
    """Losses and accuracies; the discriminator's precision and recall of 'replaced' (threshold 0: a
    discriminator that learned only the base rate says 'kept' everywhere, at accuracy = the kept
    share); and how often the generator's sample is the original token (the reference's
    sampled_masked_lm_accuracy: near 1, replacements are rare and the task is easy)."""
    n = max(float(sums["num_predictions"]), 1.0)
    t = max(float(sums["num_tokens"]), 1.0)
    mlm_loss, disc_loss = float(sums["loss_sum"]) / n, float(sums["disc_loss_sum"]) / t
    tp = float(sums["disc_true_positive_sum"])
    return dict(loss=mlm_loss + self.disc_weight * disc_loss, mlm_loss=mlm_loss,
                accuracy=float(sums["correct_sum"]) / n, disc_loss=disc_loss,
                disc_accuracy=float(sums["disc_correct_sum"]) / t, replaced=float(sums["replaced_sum"]) / t,
                disc_precision=tp / max(float(sums["disc_said_replaced_sum"]), 1.0),
                disc_recall=tp / max(float(sums["replaced_sum"]), 1.0),
                sampled_accuracy=float(sums["sampled_correct_sum"]) / n, **self.z_summary(sums))

  def summarize_eval(self, sums) -> dict:
    return dict(super().summarize_eval(sums), disc_auc=histogram_auc(sums["disc_logit_hist_replaced"],
                                                                     sums["disc_logit_hist_kept"]))

  @staticmethod
  def console(m: dict) -> str:
    return (f"loss {m['loss']:.4f}  mlm {m['mlm_loss']:.4f} acc {m['accuracy']:.3f}  disc {m['disc_loss']:.4f} "
            f"acc {m['disc_accuracy']:.3f} P {m['disc_precision']:.2f} R {m['disc_recall']:.2f}  "
            f"replaced {m['replaced']:.3f}")


class Electra(Description):
  """The ELECTRA objective (interface.py): two towers, the discriminator the encoder, the generator the
  masked LM; both exported (convert/electra_towers.py)."""
  step = ElectraStep
  export_kind = "electra"

  @classmethod
  def check(cls, config: ml_collections.ConfigDict) -> None:
    if config.electra.disc_weight < 0:
      raise ConfigError(f"electra.disc_weight={config.electra.disc_weight}: expected >= 0")
    generator_config(config)
    encoder.embedding_size(config.model)
    if config.model.position_offset != 0:   # found at export otherwise, after the training
      raise ConfigError(f"model.position_offset={config.model.position_offset}: transformers' ELECTRA numbers "
                        "positions from 0; pass --config.model.position_offset=0, or start from "
                        "configs/electra_small.py:demo")

  @classmethod
  def towers(cls, config: ml_collections.ConfigDict) -> dict:
    return {"the ELECTRA generator (electra.generator_*)": generator_config(config)}

  @classmethod
  def flops_per_token(cls, config: ml_collections.ConfigDict, seq_len: int, num_slots: int) -> float:
    """The discriminator on every token with its replaced-token head (H*H + H), plus the generator with
    its MLM head on the slots, plus the sampling logits (a forward-only E*V per slot)."""
    disc_cfg, gen_cfg = discriminator_config(config), generator_config(config)
    h = disc_cfg.hidden_size
    sampling = 2 * gen_cfg.embedding_size * gen_cfg.vocab_size * num_slots / seq_len
    return (flops.flops_per_token(disc_cfg, seq_len) + 6 * (h * h + h)
            + flops.flops_per_token(gen_cfg, seq_len, num_slots) + sampling)

  @classmethod
  def make_model(cls, config: ml_collections.ConfigDict):
    return ElectraPair(config, seed=config.seed)

  @classmethod
  def encoder(cls, config: ml_collections.ConfigDict) -> tuple:
    return "discriminator", discriminator_config(config)   # fine-tuning starts from it

  @classmethod
  def masked_lm(cls, config: ml_collections.ConfigDict) -> tuple:
    return "generator", generator_config(config)
