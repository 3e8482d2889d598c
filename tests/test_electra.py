"""ELECTRA (mlm_jax/objectives/electra.py, electra_pair.py): the pair's losses against transformers, the corruption, the sampler."""
import numpy as np
import pytest

try:   # only the comparison with transformers needs them; the other tests run without
  import torch
  import transformers
except ImportError:
  torch = transformers = None
needs_torch = pytest.mark.skipif(torch is None or transformers is None, reason="needs torch and transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
from flax import nnx  # noqa: E402

from mlm_jax.objectives import electra, electra_model  # noqa: E402
from mlm_jax.convert import electra_towers  # noqa: E402
from mlm_jax.config.defaults import default_config  # noqa: E402

V, S, B = 97, 16, 3


def _config(scan=False, embedding_size=16):
  c = default_config()
  c.objective = "electra"
  c.model.update(dict(vocab_size=V, hidden_size=32, embedding_size=embedding_size, num_layers=2, num_heads=4,
                      intermediate_size=48, max_position_embeddings=S, type_vocab_size=2, scan_layers=scan,
                      hidden_dropout=0.0, attention_dropout=0.0))
  c.electra.update(dict(generator_hidden_size=16, generator_num_heads=2, generator_intermediate_size=24,
                        generator_num_layers=1))
  c.masking.update(dict(mask_id=V - 1, special_ids=(0, 1, 2, 3), mask_rate=0.3))
  return ml_collections.FrozenConfigDict(c)


def _pair(config, noise=0.05):
  """(graphdef, params) of a pair with every parameter perturbed (no LayerNorm of ones or bias of zeros
  to hide a mistake)."""
  graphdef, params = electra_model.abstract_pair(config)
  params = jax.jit(lambda: nnx.state(electra_model.ElectraPair(config, seed=0), nnx.Param))()
  rng = np.random.default_rng(5)
  params = jax.tree.map(lambda x: jnp.asarray(np.asarray(x) + noise * rng.standard_normal(x.shape), x.dtype), params)
  return graphdef, params


@pytest.fixture(scope="module")
def scanned_pair():
  """(config, graphdef, params): both towers with scanned layers (the unscanned path is what the
  training run of tests/test_train.py exports and checks)."""
  config = _config(scan=True)
  return (config,) + _pair(config)


def _forward(config, graphdef, params, batch, key):
  """The objective's prepare + forward in one jit (eager NNX runs op by op, ~20x slower here)."""
  obj = electra.ElectraStep(config)

  def f(params, batch):
    batch = obj.prepare(batch, key)
    pair = nnx.merge(graphdef, params)
    hidden = pair.generator(batch["input_ids"], batch["segment_ids"], batch["positions"])
    return batch, obj.forward(pair, batch), pair.generator.mlm_logits(hidden)
  return jax.device_get(jax.jit(f)(params, batch))


def _batch():
  rng = np.random.default_rng(3)
  lengths = [S, 11, 6]
  ids = np.ones((B, S), np.int32)          # pad id 1
  seg = np.zeros((B, S), np.int32)
  for i, n in enumerate(lengths):
    ids[i, :n] = rng.integers(4, V - 1, n)
    ids[i, 0] = 0
    seg[i, :n] = 1
  return dict(input_ids=jnp.asarray(ids), segment_ids=jnp.asarray(seg),
              positions=jnp.tile(jnp.arange(S, dtype=jnp.int32), (B, 1)), word_starts=jnp.ones((B, S), jnp.int32))


def _hf_models(config, params):
  flats = electra_towers.tower_flats(params, config)
  out = {}
  for kind, cls, cfg in ((electra_towers.DISCRIMINATOR, transformers.ElectraForPreTraining,
                          electra_model.discriminator_config(config)),
                         (electra_towers.GENERATOR, transformers.ElectraForMaskedLM, electra_model.generator_config(config))):
    tok = type("Tok", (), dict(pad_id=1, bos_id=0, eos_id=2, mask_id=V - 1))()
    hcfg = electra_towers.hf_config(cfg, kind, tok)
    model = cls(transformers.ElectraConfig(**hcfg)).eval()
    sd = {k: torch.from_numpy(v.copy()) for k, v in electra_towers.state_dict(flats[kind], cfg, kind).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"generator_lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    out[kind] = model
  return out


@needs_torch
def test_losses_and_logits_match_transformers(scanned_pair):
  config, graphdef, params = scanned_pair
  # One embedding LayerNorm for both towers (electra.share_embedding_norm); to_hf's generator gets it
  # too, so the generator's outputs below can only match if ours runs through the shared one.
  assert "embeddings_norm" in params["discriminator"] and "embeddings_norm" not in params["generator"]
  batch, out, gen_logits = _forward(config, graphdef, params, _batch(), jax.random.key(7))
  sums = out["sums"]
  models = _hf_models(config, params)
  mask = torch.from_numpy(np.asarray(batch["segment_ids"]) != 0).long()

  # Generator: MLM loss over the used slots, and the logits there.
  labels = np.full((B, S), -100, np.int64)
  pos, lab, w = (np.asarray(batch[k]) for k in ("masked_positions", "masked_labels", "masked_weights"))
  for b in range(B):
    for p, l, wt in zip(pos[b], lab[b], w[b]):
      if wt > 0:
        labels[b, p] = l
  with torch.no_grad():
    g = models[electra_towers.GENERATOR](input_ids=torch.from_numpy(np.asarray(batch["input_ids"])).long(),
                                          attention_mask=mask, labels=torch.from_numpy(labels))
  assert sums["num_predictions"] == (labels >= 0).sum() > 0
  np.testing.assert_allclose(sums["loss_sum"] / sums["num_predictions"], g.loss.item(), rtol=1e-4, atol=1e-4)
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(gen_logits[real], g.logits.numpy()[real], atol=1e-4, rtol=1e-4)

  # Discriminator: on the corrupted sequence, BCE over the real tokens with our labels.
  with torch.no_grad():
    d = models[electra_towers.DISCRIMINATOR](input_ids=torch.from_numpy(np.asarray(out["corrupted"])).long(),
                                              attention_mask=mask, labels=torch.from_numpy(np.asarray(out["labels"])))
  np.testing.assert_allclose(sums["disc_loss_sum"] / sums["num_tokens"], d.loss.item(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(out["disc_logits"])[real], d.logits.numpy()[real], atol=1e-4, rtol=1e-4)
  assert sums["num_tokens"] == real.sum()


def test_replacements_come_from_masked_slots_and_labels_mark_changes(scanned_pair):
  config, graphdef, params = scanned_pair
  # Make the generator always sample token 7, and put 7 in the text: masked slots holding 7 stay the same.
  params = jax.tree.map(lambda x: x, params)
  params["generator"]["decoder_bias"].value = params["generator"]["decoder_bias"].value.at[7].set(1e4)
  base = _batch()
  ids = np.asarray(base["input_ids"]).copy()
  ids[:, 1::2] = np.where(np.asarray(base["segment_ids"])[:, 1::2] > 0, 7, ids[:, 1::2])
  base["input_ids"] = jnp.asarray(ids)
  batch, out, _ = _forward(config, graphdef, params, base, jax.random.key(3))
  original, corrupted, labels = ids, out["corrupted"], out["labels"]
  slots = np.zeros_like(ids, bool)
  for b in range(B):
    slots[b, batch["masked_positions"][b][np.asarray(batch["masked_weights"][b]) > 0]] = True
  assert (corrupted[~slots] == original[~slots]).all()           # only masked slots change
  assert (corrupted[slots] == 7).all()                           # ... to the generator's sample
  np.testing.assert_array_equal(labels, (corrupted != original).astype(np.float32))
  assert ((original[slots] == 7) & (labels[slots] == 0)).any()   # a sample equal to the original is no replacement
  assert (labels[slots] == 1).any()
  assert out["sums"]["replaced_sum"] == labels.sum()


def test_runs_from_before_the_shared_embedding_norm_keep_one_per_tower():
  """A config.json written before electra.share_embedding_norm reads as False: the two norms it saved."""
  from mlm_jax.workdir import files as workdir_files
  old = default_config().to_dict()
  old["objective"] = "electra"
  del old["electra"]["share_embedding_norm"]
  config = workdir_files.resolved_of(old)
  assert config.electra.share_embedding_norm is False
  config.model.update(_config().model.to_dict())
  _, shapes = electra_model.abstract_pair(config)
  assert "embeddings_norm" in shapes["generator"] and "embeddings_norm" in shapes["discriminator"]


def test_gumbel_max_samples_follow_the_softmax():
  logits = jnp.log(jnp.asarray([0.5, 0.3, 0.15, 0.05]))[None, None, :]
  n = 20000
  seeds = jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(jax.random.key(0), i)))(jnp.arange(n))
  draws = np.asarray(electra_model.sample_slots(jnp.broadcast_to(logits, (n, 1, 4)), seeds))[:, 0]
  freq = np.bincount(draws, minlength=4) / n
  np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.015)


def test_an_electra_run_that_could_not_export_is_refused_at_start(tmp_path):
  """configs/demo.py numbers positions from 2 (XLM-R's layout); transformers' ELECTRA from 0. The run is refused
  before anything is written (demo corpus, tokenizer), in one line naming the config that works."""
  import importlib.util
  import pathlib
  from mlm_jax.training import provision, resolve
  from mlm_jax.errors import ConfigError
  configs = pathlib.Path(__file__).resolve().parents[1] / "configs"
  spec = importlib.util.spec_from_file_location("demo", configs / "demo.py")
  demo = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(demo)
  c = demo.get_config()
  c.objective = "electra"
  with pytest.raises(ConfigError, match=r"^model.position_offset=2: .*configs/electra_small.py:demo$") as e:
    provision.pretraining(c, str(tmp_path))
  assert "\n" not in str(e.value) and not list(tmp_path.iterdir())
  spec = importlib.util.spec_from_file_location("electra_small", configs / "electra_small.py")
  electra_small = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(electra_small)
  c = electra_small.get_config("demo")
  c.model.vocab_size = 128
  resolve.resolve_for_compile(c, platform="cpu")   # the fix named resolves


def test_held_out_auc_precision_recall_and_sampled_accuracy(scanned_pair):
  """The eval sums' logit histograms give the AUC up to the bin width; on the real pair the
  histograms count every real token once, and precision / recall / sampled accuracy agree with the
  forward pass's own labels, logits and samples."""
  rng = np.random.default_rng(0)
  pos, neg = rng.normal(1.0, 1.5, 4000), rng.normal(0.0, 1.5, 6000)
  exact = (pos[:, None] > neg[None, :]).mean()
  hist = lambda x: electra.logit_histogram(jnp.asarray(x), jnp.ones(len(x)))
  assert abs(electra.histogram_auc(hist(pos), hist(neg)) - exact) < 0.005
  assert electra.histogram_auc(hist(pos + 20.0), hist(neg - 20.0)) == 1.0   # beyond the range: end bins
  assert electra.histogram_auc(hist(neg), hist(neg)) == pytest.approx(0.5)
  # counts, not float32 sums: exact past 2^24 in one bin (float32 would stop at 16777216)
  many = electra.logit_histogram(jnp.zeros((1 << 24) + 3), jnp.ones((1 << 24) + 3))
  assert jnp.issubdtype(many.dtype, jnp.integer) and int(many[electra.AUC_BINS // 2]) == (1 << 24) + 3

  config, graphdef, params = scanned_pair
  obj, key = electra.ElectraStep(config), jax.random.key(7)
  sums = jax.device_get(jax.jit(lambda p, b: obj.evaluate(nnx.merge(graphdef, p), b, key))(params, _batch()))
  batch, out, _ = _forward(config, graphdef, params, _batch(), key)
  labels, logits, real = out["labels"], out["disc_logits"], np.asarray(batch["segment_ids"] > 0, np.float32)
  assert sums["disc_logit_hist_replaced"].sum() == labels.sum() > 0
  assert sums["disc_logit_hist_kept"].sum() == real.sum() - labels.sum()
  rates = obj.summarize_eval(sums)
  said = (logits > 0) * real
  assert rates["disc_recall"] == pytest.approx((said * labels).sum() / labels.sum())
  assert rates["disc_precision"] == pytest.approx((said * labels).sum() / max(said.sum(), 1))
  slots = np.asarray(batch["masked_weights"], np.float32)
  assert rates["sampled_accuracy"] == pytest.approx(((out["sampled"] == batch["masked_labels"]) * slots).sum() / slots.sum())
  width = 2 * electra.AUC_RANGE / electra.AUC_BINS   # the exact AUC of the binned logits, ties half
  binned = np.floor((np.clip(logits, -8, 8 - width / 2) + electra.AUC_RANGE) / width)
  p, n = binned[(labels > 0) & (real > 0)], binned[(labels == 0) & (real > 0)]
  pairs = (p[:, None] > n[None, :]) + 0.5 * (p[:, None] == n[None, :])
  assert rates["disc_auc"] == pytest.approx(pairs.mean())
  assert {"perplexity", "mlm_loss", "disc_loss"} <= set(rates)
