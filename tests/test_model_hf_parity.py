"""Our Encoder reproduces transformers' BERT / RoBERTa / XLM-R masked LMs given the same weights."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from mlm_jax.convert import bert  # noqa: E402
from mlm_jax.config.defaults import default_config  # noqa: E402
from mlm_jax.model.encoder import Encoder  # noqa: E402

SMALL = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=48, max_position_embeddings=40, hidden_dropout_prob=0.1,
             attention_probs_dropout_prob=0.1)


def _hf_model(arch):
  torch.manual_seed(0)
  if arch == "bert":
    cfg = transformers.BertConfig(**SMALL, type_vocab_size=2, pad_token_id=0)
    model = transformers.BertForMaskedLM(cfg)
  elif arch == "roberta":
    cfg = transformers.RobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)
    model = transformers.RobertaForMaskedLM(cfg)
  else:
    cfg = transformers.XLMRobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)
    model = transformers.XLMRobertaForMaskedLM(cfg)
  # Non-trivial LayerNorm and bias values, so a mapping mistake cannot hide behind ones and zeros.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  return model.eval(), cfg


def _padded_batch(arch, pad_id, vocab):
  rng = np.random.default_rng(1)
  lengths = [12, 7, 3]
  s = max(lengths)
  ids = np.full((len(lengths), s), pad_id, np.int64)
  mask = np.zeros((len(lengths), s), np.int64)
  for i, n in enumerate(lengths):
    ids[i, :n] = rng.integers(3, vocab, n)
    mask[i, :n] = 1
  types = (rng.integers(0, 2, ids.shape) * mask) if arch == "bert" else np.zeros_like(ids)
  return ids, mask, types


@pytest.mark.parametrize("arch", ["bert", "roberta", "xlm-roberta"])
def test_hidden_states_and_logits_match_transformers(arch):
  model, hcfg = _hf_model(arch)
  cfg = bert.model_config_from_hf(hcfg.to_dict(), default_config().model)
  ours = Encoder(cfg)
  graphdef, template = nnx.split(ours, nnx.Param)
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  params = bert.params_from_hf(sd, cfg, arch, template)
  ours = nnx.merge(graphdef, params)

  ids, mask, types = _padded_batch(arch, hcfg.pad_token_id, hcfg.vocab_size)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                token_type_ids=torch.tensor(types), output_hidden_states=True)
  ref_hidden = out.hidden_states[-1].numpy()
  ref_logits = out.logits.numpy()

  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(np.int32)
  hidden = ours(jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32), jnp.asarray(positions),
                jnp.asarray(types, jnp.int32))
  logits = ours.mlm_logits(hidden)
  real = mask.astype(bool)
  assert np.isfinite(np.asarray(hidden)).all()
  np.testing.assert_allclose(np.asarray(hidden)[real], ref_hidden[real], atol=1e-4, rtol=0)
  np.testing.assert_allclose(np.asarray(logits)[real], ref_logits[real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["bert", "xlm-roberta"])
def test_hf_to_ours_to_hf_is_exact(arch):
  model, hcfg = _hf_model(arch)
  cfg = bert.model_config_from_hf(hcfg.to_dict(), default_config().model)
  graphdef, template = nnx.split(Encoder(cfg), nnx.Param)
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  back = bert.params_to_hf(bert.params_from_hf(sd, cfg, arch, template), cfg, arch)
  for name, value in back.items():
    np.testing.assert_array_equal(value, sd[name], err_msg=name)
  # Every HF tensor is covered, except buffers and the decoder tied to the word embeddings.
  skipped = {k for k in sd if k not in back}
  assert all(k.endswith(("position_ids", "token_type_ids", "decoder.weight", "decoder.bias")) for k in skipped), skipped


def test_shape_mismatch_names_the_tensor():
  model, hcfg = _hf_model("bert")
  cfg = bert.model_config_from_hf(hcfg.to_dict(), default_config().model)
  _, template = nnx.split(Encoder(cfg), nnx.Param)
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  sd["bert.encoder.layer.1.intermediate.dense.bias"] = np.zeros(7, np.float32)
  with pytest.raises(ValueError, match=r"layers\.1\.mlp\.wi_bias: shape \(7,\)"):
    bert.params_from_hf(sd, cfg, "bert", template)


def test_bert_pooler_is_imported_when_the_checkpoint_has_one():
  """Checkpoints saved from BertForPreTraining carry `bert.pooler.*`; the import keeps it."""
  from mlm_jax.convert import folders
  model, hcfg = _hf_model("bert")
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  torch.manual_seed(1)
  pooled = transformers.BertModel(hcfg).eval()
  sd["bert.pooler.dense.weight"] = pooled.pooler.dense.weight.detach().numpy()
  sd["bert.pooler.dense.bias"] = pooled.pooler.dense.bias.detach().numpy()
  cfg = folders.model_config(hcfg.to_dict())
  graphdef, params, fresh_head = folders.params_from_state_dict(sd, cfg, "bert")
  assert not fresh_head
  assert cfg.use_pooler
  ours = nnx.merge(graphdef, params)
  ids, mask, types = _padded_batch("bert", 0, hcfg.vocab_size)
  pooled.load_state_dict({k[len("bert."):]: torch.tensor(v) for k, v in sd.items() if k.startswith("bert.")},
                         strict=False)
  with torch.no_grad():
    ref = pooled(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 token_type_ids=torch.tensor(types)).pooler_output.numpy()
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(np.int32)
  hidden = ours(jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32), jnp.asarray(positions),
                jnp.asarray(types, jnp.int32))
  np.testing.assert_allclose(np.asarray(ours.pool(hidden)), ref, atol=1e-4)


@pytest.mark.parametrize("arch", ["bert", "xlm-roberta"])
def test_mlm_loss_matches_transformers(arch):
  """Our step's MLM loss (masking -> sparse slots -> mean NLL) is transformers' *ForMaskedLM loss with labels
  at the masked positions, on the same corrupted batch: the number continued pretraining starts from."""
  import jax
  from mlm_jax.objectives.mlm import MLM
  model, hcfg = _hf_model(arch)
  config = default_config()
  config.model = bert.model_config_from_hf(hcfg.to_dict(), config.model)
  config.masking.mask_id, config.masking.special_ids = 4, (0, 1, 2, 3)
  graphdef, template = nnx.split(Encoder(config.model), nnx.Param)
  ours = nnx.merge(graphdef, bert.params_from_hf({k: v.detach().numpy() for k, v in model.state_dict().items()},
                                               config.model, arch, template))
  ids, mask, types = _padded_batch(arch, hcfg.pad_token_id, hcfg.vocab_size)
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  batch = dict(input_ids=jnp.asarray(ids, jnp.int32), segment_ids=jnp.asarray(mask, jnp.int32),
               positions=jnp.asarray(positions, jnp.int32), token_type_ids=jnp.asarray(types, jnp.int32))
  objective = MLM.step(config)
  masked = jax.jit(objective.prepare)(batch, jax.random.key(3))
  loss_sum, sums = nnx.jit(lambda m, b: objective.loss_sums(m, b, None))(ours, masked)
  ours_loss = float(loss_sum / sums["num_predictions"])

  labels = np.full(ids.shape, -100, np.int64)
  w = np.asarray(masked["masked_weights"]) > 0
  rows = np.nonzero(w)[0]
  labels[rows, np.asarray(masked["masked_positions"])[w]] = np.asarray(masked["masked_labels"])[w]
  assert (labels != -100).sum() == int(sums["num_predictions"]) > 0
  with torch.no_grad():
    ref = model(input_ids=torch.tensor(np.asarray(masked["input_ids"]), dtype=torch.long),
                attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types),
                labels=torch.tensor(labels)).loss.item()
  assert abs(ours_loss - ref) < 1e-4, (ours_loss, ref)


# ---- ModernBERT: 5 layers, global every 3 (layers 0 and 3), 8-token windows (|i - j| <= 4) ----
def _modernbert(biases: bool):
  torch.manual_seed(0)
  cfg = transformers.ModernBertConfig(
      vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=5, num_attention_heads=4,
      global_attn_every_n_layers=3, local_attention=8, max_position_embeddings=64, global_rope_theta=1000.0,
      local_rope_theta=50.0, pad_token_id=1, bos_token_id=0, eos_token_id=2, cls_token_id=0, sep_token_id=2,
      attention_bias=biases, mlp_bias=biases, norm_bias=biases, classifier_bias=biases,
      attn_implementation="eager")
  model = transformers.ModernBertForMaskedLM(cfg)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
      if name.endswith("Wqkv.weight"):   # peaked attention, so that positions and windows show in the logits
        p.mul_(6.0)
  return model.eval(), cfg


def _ours_from(model, hcfg, **overrides):
  from mlm_jax.model.encoder import abstract_model
  cfg = bert.model_config_from_hf(hcfg.to_dict(), default_config().model)
  cfg.update(overrides)
  graphdef, template = abstract_model(cfg)
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  return nnx.merge(graphdef, bert.params_from_hf(sd, cfg, "modernbert", template)), cfg, sd


@nnx.jit
def _logits(model, ids, seg, pos):   # one compile per model and shape is cheaper than op-by-op dispatch
  return model.mlm_logits(model(ids, seg, pos))


def _ours_logits(ours, ids, seg, pos):
  return np.asarray(_logits(ours, jnp.asarray(ids, jnp.int32), jnp.asarray(seg, jnp.int32), jnp.asarray(pos, jnp.int32)))


@pytest.mark.parametrize("biases", [False, True])
def test_modernbert_logits_match_transformers_padded_and_packed(biases):
  """Padded rows against HF with its attention mask; packed rows (documents with their own segment ids
  and positions from 0) against HF run on each document alone; the scanned model on the packed rows."""
  model, hcfg = _modernbert(biases)
  ours, cfg, _ = _ours_from(model, hcfg)
  assert (cfg.global_attention_every, cfg.local_window, cfg.rope_theta, cfg.rope_theta_local) == (3, 8, 1000.0, 50.0)
  rng = np.random.default_rng(1)

  lengths = [20, 13, 5]
  ids = np.ones((3, 20), np.int64)
  mask = np.zeros((3, 20), np.int64)
  for i, n in enumerate(lengths):
    ids[i, :n], mask[i, :n] = rng.integers(3, 101, n), 1
  with torch.no_grad():
    ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  pos = np.broadcast_to(np.arange(20), ids.shape)
  real = mask.astype(bool)
  np.testing.assert_allclose(_ours_logits(ours, ids, mask, pos)[real], ref[real], atol=1e-4, rtol=0)

  rows = [[11, 6, 2], [14, 5]]   # documents per row; the first row ends in one padding token
  ids, seg, pos = np.ones((2, 20), np.int64), np.zeros((2, 20), np.int64), np.zeros((2, 20), np.int64)
  refs = []
  for r, docs in enumerate(rows):
    start = 0
    for d, n in enumerate(docs):
      doc = rng.integers(3, 101, n)
      ids[r, start:start + n], seg[r, start:start + n], pos[r, start:start + n] = doc, d + 1, np.arange(n)
      with torch.no_grad():
        refs.append(((r, start, n), model(input_ids=torch.tensor(doc[None])).logits.numpy()[0]))
      start += n
  scanned, _, _ = _ours_from(model, hcfg, scan_layers=True)
  for got in (_ours_logits(ours, ids, seg, pos), _ours_logits(scanned, ids, seg, pos)):
    for (r, start, n), want in refs:
      np.testing.assert_allclose(got[r, start:start + n], want, atol=1e-4, rtol=0)


def test_modernbert_hf_to_ours_to_hf_is_exact():
  """Fused Wqkv / Wi split on import and joined on export, bit for bit, scanned or not."""
  model, hcfg = _modernbert(biases=True)
  for scan in (False, True):
    ours, cfg, sd = _ours_from(model, hcfg, scan_layers=scan)
    back = bert.params_to_hf(nnx.state(ours, nnx.Param), cfg, "modernbert")
    assert set(sd) - set(back) == {"decoder.weight"}, set(sd) ^ set(back)   # tied to the word embeddings
    for name, value in back.items():
      np.testing.assert_array_equal(value, sd[name], err_msg=name)
