"""objective='gpt_bert' (mlm_jax/objectives/gpt_bert.py): its masked next-token and causal losses against a direct
computation with the model's own logits, its rows, and a run with LAMB, z-loss and the LTG switches that
trains, saves and resumes exactly through the one loop."""
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mlm_jax.config.defaults import default_config
from mlm_jax.model import sharding
from mlm_jax.model.encoder import Encoder
from mlm_jax.objectives.gpt_bert import GptBert
from mlm_jax.training import loop, resolve, trainer as trainer_lib

from test_objective_plugin import RandomRows   # the loop's input, stateless

BOS, EOS, MASK, VOCAB, S = 1, 2, 49, 50, 16


def _config(rows=4, share=0.5, **model):
  c = default_config()
  c.objective = "gpt_bert"
  c.model.update(dict(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                      max_position_embeddings=S, hidden_dropout=0.0, attention_dropout=0.0), **model)
  c.data.seq_len = S
  c.masking.update(mask_id=MASK, special_ids=(0, BOS, EOS, 3), mask_rate=0.3, mode="span_uniform", span_max=3)
  c.train.batch_size = rows
  c.gpt_bert.causal_share = share
  return c


def _rows(n, seed=0):
  """Rows of two documents (<s> ... </s>, 9 and 5 tokens) and two padding slots, as data/ packs them."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(4, MASK, (n, S)).astype(np.int32)
  seg = np.tile(np.r_[[1] * 9, [2] * 5, [0] * 2], (n, 1)).astype(np.int32)
  ids[:, [0, 9]], ids[:, [8, 13]], ids[:, 14:] = BOS, EOS, 0
  pos = np.tile(np.r_[np.arange(9), np.arange(5), [0, 0]], (n, 1)).astype(np.int32)
  return dict(input_ids=ids, segment_ids=seg, positions=pos, word_starts=np.ones_like(ids))


def test_masked_and_causal_losses_equal_a_direct_computation():
  """Rows 0-1 masked: each masked token's NLL from the full logits at the position before it; rows 2-3
  causal: each next token's NLL from the logits of the row cut after the position (what causal attention
  sees), within its document; loss = (1 - c) MNTP mean + c causal mean, each with 1e-3 x log(Z)^2."""
  c = _config()
  c.loss.z_loss = 1e-3
  objective = GptBert.step(c)
  graphdef, params = nnx.split(Encoder(c.model, seed=2), nnx.Param)
  raw = _rows(4)
  batch = jax.jit(objective.prepare)({k: jnp.asarray(v) for k, v in raw.items()}, jax.random.key(5))
  ids = np.asarray(batch["input_ids"])
  np.testing.assert_array_equal(ids[2:], raw["input_ids"][2:])   # causal rows are fed as they are
  assert (ids[:2] == MASK).sum() >= 4
  loss, sums = jax.jit(lambda p, b: objective.loss_sums(nnx.merge(graphdef, p), b, None))(params, batch)

  def logits_of(params, *row):
    model = nnx.merge(graphdef, params)
    return model.mlm_logits(model(*row))
  logits_of = jax.jit(logits_of)

  def nll_and_z(logits, label):
    return -float(jax.nn.log_softmax(logits)[label]), float(jax.nn.logsumexp(logits)) ** 2

  seg, pos = raw["segment_ids"], raw["positions"]
  full = logits_of(params, batch["input_ids"][:2], seg[:2], pos[:2])
  masked = [nll_and_z(full[r, t - 1], raw["input_ids"][r, t])
            for r in range(2) for t, w in zip(np.asarray(batch["masked_positions"][r]), np.asarray(batch["masked_weights"][r]))
            if w > 0]
  # causal rows: position t's output under causal attention is its output on the row cut after t
  where = [(r, t) for r in (2, 3) for t in range(S - 1) if seg[r, t + 1] == seg[r, t] > 0]
  cut = np.stack([np.where(np.arange(S) <= t, seg[r], 0) for r, t in where])
  rows = np.asarray([r for r, _ in where])
  logits = logits_of(params, raw["input_ids"][rows], cut, pos[rows])
  causal = [nll_and_z(logits[i, t], raw["input_ids"][r, t + 1]) for i, (r, t) in enumerate(where)]
  assert float(sums["num_predictions"]) == len(masked) and float(sums["clm_predictions"]) == len(causal) == 2 * (8 + 4)
  mntp, clm = np.mean(masked, axis=0), np.mean(causal, axis=0)
  np.testing.assert_allclose(float(sums["loss_sum"]) / len(masked), mntp[0], rtol=1e-5)
  np.testing.assert_allclose(float(sums["clm_loss_sum"]) / len(causal), clm[0], rtol=1e-5)
  expected = 0.5 * (mntp[0] + 1e-3 * mntp[1]) + 0.5 * (clm[0] + 1e-3 * clm[1])
  np.testing.assert_allclose(float(loss) / float(sums["num_predictions"]), expected, rtol=1e-5)
  logged = objective.summarize(jax.tree.map(float, sums))
  assert logged["loss"] == pytest.approx(0.5 * mntp[0] + 0.5 * clm[0], rel=1e-5)


def test_causal_rows_are_the_last_of_each_microbatch_and_the_share_is_checked():
  c = _config(rows=8, share=0.25)
  c.optimizer.grad_accum_steps = 2
  raw = _rows(8)
  ids = np.asarray(jax.jit(GptBert.step(c).prepare)({k: jnp.asarray(v) for k, v in raw.items()}, jax.random.key(0))["input_ids"])
  same = (ids == raw["input_ids"]).all(axis=1)
  assert same.tolist() == [False] * 6 + [True] * 2
  # as the trainer splits the batch: the last row of each microbatch is the causal one
  assert np.asarray(trainer_lib._microbatches(same, 2)).tolist() == [[False, False, False, True]] * 2
  c.gpt_bert.causal_share = 0.05   # of 4 rows a microbatch: none
  with pytest.raises(ValueError, match=r"gpt_bert.causal_share=0.05 of 4 rows a microbatch gives 0 causal rows"):
    GptBert.check(c)
  c.gpt_bert.causal_share, c.model.attention_impl = 0.25, "splash"
  with pytest.raises(ValueError, match=r"attention_impl=splash: objective=gpt_bert trains causal rows"):
    GptBert.check(c)


class Rows(RandomRows):
  """_rows as the loop's input: one fixed batch (masked anew each step), so the loss falls in a few steps."""

  def batch(self, step: int) -> dict:
    return _rows(8)


def _run(config, workdir) -> list:
  run = resolve.resolve_for_compile(config, platform="cpu")
  mesh = sharding.make_mesh(run.config.mesh, devices=jax.devices()[:1])
  trainer = trainer_lib.make_trainer(run.config, mesh, run.objective)
  loop.Loop(trainer, str(workdir), Rows(), None, trainer.init, tokens_per_example=S, flops_per_token=1.0).run()
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_hybrid_with_lamb_z_loss_and_ltg_switches_trains_and_resumes_exactly(tmp_path):
  """GPT-BERT's recipe on the LTG switches: LAMB (its state checkpointed), z-loss, the mask rate falling 30% ->
  15%, extra norms and layer weighting: 4 steps learn without a non-finite value, and a run resumed from step 2's
  checkpoint logs steps 3 and 4 exactly as the straight run did."""
  c = _config(rows=8, share=0.25, extra_norms=True, layer_weighting=True, mlp="geglu", norm="pre")
  c.loss.z_loss = 1e-4
  c.masking.update(mask_rate_schedule=("0:0.3", "4:0.15"), mask_rate_schedule_mode="linear")
  c.optimizer.update(name="lamb", learning_rate=1e-2, warmup_steps=0, weight_decay=0.1)
  c.train.update(steps=4, log_every=1, save_every=2, peak_tflops_per_device=1.0)
  straight = _run(c, tmp_path / "a")
  assert [m["step"] for m in straight] == [1, 2, 3, 4]
  assert all(np.isfinite([m["loss"], m["clm_loss"], m["z_loss"], m["grad_norm"]]).all() for m in straight)
  assert straight[-1]["loss"] < straight[0]["loss"] and straight[-1]["mask_rate"] < straight[0]["mask_rate"]
  shutil.copytree(tmp_path / "a", tmp_path / "b")
  shutil.rmtree(tmp_path / "b" / "checkpoints" / "4")
  (tmp_path / "b" / "metrics.jsonl").write_text("")
  resumed = _run(c, tmp_path / "b")
  assert [m["step"] for m in resumed] == [3, 4]
  for a, b in zip(straight[2:], resumed):
    for key in ("loss", "clm_loss", "accuracy", "grad_norm"):
      assert a[key] == b[key], (key, a, b)
