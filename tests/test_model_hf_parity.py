"""Our Encoder reproduces transformers' BERT / RoBERTa / XLM-R masked LMs given the same weights."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from mlm_jax.convert import hf  # noqa: E402
from mlm_jax.defaults import default_config  # noqa: E402
from mlm_jax.model import Encoder  # noqa: E402

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
  cfg = hf.model_config_from_hf(hcfg.to_dict(), default_config().model)
  ours = Encoder(cfg)
  graphdef, template = nnx.split(ours, nnx.Param)
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  params = hf.params_from_hf(sd, cfg, arch, template)
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
  cfg = hf.model_config_from_hf(hcfg.to_dict(), default_config().model)
  graphdef, template = nnx.split(Encoder(cfg), nnx.Param)
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  back = hf.params_to_hf(hf.params_from_hf(sd, cfg, arch, template), cfg, arch)
  for name, value in back.items():
    np.testing.assert_array_equal(value, sd[name], err_msg=name)
  # Every HF tensor is covered, except buffers and the decoder tied to the word embeddings.
  skipped = {k for k in sd if k not in back}
  assert all(k.endswith(("position_ids", "token_type_ids", "decoder.weight", "decoder.bias")) for k in skipped), skipped


def test_shape_mismatch_names_the_tensor():
  model, hcfg = _hf_model("bert")
  cfg = hf.model_config_from_hf(hcfg.to_dict(), default_config().model)
  _, template = nnx.split(Encoder(cfg), nnx.Param)
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  sd["bert.encoder.layer.1.intermediate.dense.bias"] = np.zeros(7, np.float32)
  with pytest.raises(ValueError, match=r"layers\.1\.mlp\.wi_bias: shape \(7,\)"):
    hf.params_from_hf(sd, cfg, "bert", template)


def test_bert_pooler_is_imported_when_the_checkpoint_has_one():
  """Checkpoints saved from BertForPreTraining carry `bert.pooler.*`; the import keeps it."""
  from mlm_jax.convert import checkpoint_io
  model, hcfg = _hf_model("bert")
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  torch.manual_seed(1)
  pooled = transformers.BertModel(hcfg).eval()
  sd["bert.pooler.dense.weight"] = pooled.pooler.dense.weight.detach().numpy()
  sd["bert.pooler.dense.bias"] = pooled.pooler.dense.bias.detach().numpy()
  cfg = checkpoint_io.model_config(hcfg.to_dict())
  graphdef, params, fresh_head = checkpoint_io.params_from_state_dict(sd, cfg, "bert")
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
  from mlm_jax import step
  model, hcfg = _hf_model(arch)
  config = default_config()
  config.model = hf.model_config_from_hf(hcfg.to_dict(), config.model)
  config.masking.mask_id, config.masking.special_ids = 4, (0, 1, 2, 3)
  graphdef, template = nnx.split(Encoder(config.model), nnx.Param)
  ours = nnx.merge(graphdef, hf.params_from_hf({k: v.detach().numpy() for k, v in model.state_dict().items()},
                                               config.model, arch, template))
  ids, mask, types = _padded_batch(arch, hcfg.pad_token_id, hcfg.vocab_size)
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  batch = dict(input_ids=jnp.asarray(ids, jnp.int32), segment_ids=jnp.asarray(mask, jnp.int32),
               positions=jnp.asarray(positions, jnp.int32), token_type_ids=jnp.asarray(types, jnp.int32))
  objective = step.MLM(config)
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
