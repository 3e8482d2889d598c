"""Folder-level conversion (tools/convert_checkpoint.py): transformers folder <-> our checkpoint.

Small random BERT / RoBERTa / XLM-R masked LMs made by transformers (token types, padding ids,
non-trivial LayerNorms) go HF -> from_hf -> to_hf -> HF: every tensor comes back bit for bit, and
our model restored from the from_hf checkpoint gives transformers' logits on a padded batch.
The error cases each get one line naming the file, architecture, vocabulary or tensor, exit
code 2, and leave existing output alone.
"""
import gzip
import importlib.util
import json
import os
import pathlib
import pickle

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from mlm_jax.workdir import restore
from mlm_jax.evaluation import fill_mask  # noqa: E402
from mlm_jax.convert import folders  # noqa: E402
from mlm_jax.data.tokenizers import spm_training  # noqa: E402


def _tool(name):
  """A tools/ script as a module, to call its main(argv) in-process."""
  spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).resolve().parents[1] / "tools" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


convert_checkpoint = _tool("convert_checkpoint")

VOCAB = 300
@pytest.fixture(scope="module")
def spm(shared_data, tmp_path_factory):
  """Tiny sentencepiece models of both layouts (on Botchan) whose size matches the random HF models."""
  root = tmp_path_factory.mktemp("convert_spm")
  with gzip.open(shared_data / "corpus/en/botchan.txt.gz", "rt", encoding="utf-8-sig") as f:
    lines = [l.strip() for _, l in zip(range(600), f) if l.strip()]
  (root / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  out = {}
  for layout in ("xlmr", "bert"):
    tok = spm_training.train([str(root / "text.txt")], str(root / layout), vocab_size=VOCAB, layout=layout,
                                byte_fallback=False, character_coverage=1.0, verbose=False)
    out[layout] = tok
  return out


def _hf_model(arch, vocab=VOCAB):
  torch.manual_seed(0)
  small = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
               max_position_embeddings=40)
  if arch == "bert":
    model = transformers.BertForMaskedLM(transformers.BertConfig(**small, type_vocab_size=2, pad_token_id=0))
  else:
    cls = transformers.RobertaForMaskedLM if arch == "roberta" else transformers.XLMRobertaForMaskedLM
    conf = (transformers.RobertaConfig if arch == "roberta" else transformers.XLMRobertaConfig)(
        **small, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
    model = cls(conf)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  return model.eval()


def _save_hf(model, path, tok=None):
  model.save_pretrained(str(path))
  if tok is not None:   # our own tokenizer files, as to_hf writes them
    from mlm_jax.convert import tokenizer_files
    tokenizer_files.write(tok, str(path), 38)
  return path


def _padded_batch(arch, pad_id):
  rng = np.random.default_rng(1)
  lengths = [12, 7, 3]
  ids = np.full((3, 12), pad_id, np.int64)
  mask = np.zeros((3, 12), np.int64)
  for i, n in enumerate(lengths):
    ids[i, :n] = rng.integers(5, VOCAB, n)
    mask[i, :n] = 1
  types = rng.integers(0, 2, ids.shape) * mask if arch == "bert" else np.zeros_like(ids)
  return ids, mask, types


def test_bert_for_pretraining_keeps_its_nsp_head(tmp_path, spm):
  """A BertForPreTraining folder (bert-base-uncased's kind) imports with its pooler and NSP head:
  our NSP and MLM logits equal transformers', and to_hf writes the same tensors back."""
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(transformers.BertConfig(
      vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
      max_position_embeddings=40, type_vocab_size=2, pad_token_id=0)).eval()
  src = _save_hf(model, tmp_path / "hf", spm["bert"])
  folders.from_hf(str(src), str(tmp_path / "ours"))
  lm = fill_mask.from_workdir(str(tmp_path / "ours"))
  assert lm.model_config.sentence_head and lm.model_config.use_pooler
  ids, mask, types = _padded_batch("bert", 0)
  with torch.no_grad():
    ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types))
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  hidden = lm.model(jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32), jnp.asarray(positions, jnp.int32),
                    jnp.asarray(types, jnp.int32))
  np.testing.assert_allclose(np.asarray(lm.model.sentence_logits(hidden)), ref.seq_relationship_logits.numpy(),
                             atol=1e-4, rtol=0)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(lm.model.mlm_logits(hidden))[real], ref.prediction_logits.numpy()[real],
                             atol=1e-4, rtol=0)
  folders.to_hf(str(tmp_path / "ours"), str(tmp_path / "back"), arch="bert")
  back = load_file(str(tmp_path / "back" / "model.safetensors"))
  for name in ("cls.seq_relationship.weight", "cls.seq_relationship.bias", "bert.pooler.dense.weight"):
    np.testing.assert_array_equal(back[name], model.state_dict()[name].numpy(), err_msg=name)


@pytest.mark.parametrize("arch", ["bert", "roberta", "xlm-roberta"])
def test_hf_to_ours_to_hf_folders(tmp_path, spm, arch):
  model = _hf_model(arch)
  tok = spm["bert" if arch == "bert" else "xlmr"]
  src = _save_hf(model, tmp_path / "hf", tok)
  summary = folders.from_hf(str(src), str(tmp_path / "ours"))
  assert summary["tokenizer"] and os.path.exists(summary["tokenizer"])
  folders.to_hf(str(tmp_path / "ours"), str(tmp_path / "back"), arch=arch)

  ref = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  back = load_file(str(tmp_path / "back" / "model.safetensors"))
  for name, value in back.items():
    np.testing.assert_array_equal(value, ref[name], err_msg=name)
  missing = {k for k in ref if k not in back}
  assert all(k.endswith(("position_ids", "token_type_ids", "decoder.weight", "decoder.bias")) for k in missing)
  reloaded, info = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "back"),
                                                                     output_loading_info=True)
  assert type(reloaded) is type(model) and not info["missing_keys"] and not info["mismatched_keys"]
  for name, value in reloaded.state_dict().items():
    np.testing.assert_array_equal(value.numpy(), ref[name], err_msg=name)

  # Our model, restored from the from_hf checkpoint, against transformers on a padded batch.
  lm = fill_mask.from_workdir(str(tmp_path / "ours"))
  ids, mask, types = _padded_batch(arch, model.config.pad_token_id)
  with torch.no_grad():
    ref_logits = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                       token_type_ids=torch.tensor(types)).logits.numpy()
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  hidden = lm.model(jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32), jnp.asarray(positions, jnp.int32),
                    jnp.asarray(types, jnp.int32))
  logits = np.asarray(lm.model.mlm_logits(hidden))
  real = mask.astype(bool)
  np.testing.assert_allclose(logits[real], ref_logits[real], atol=1e-4, rtol=0)


def test_modernbert_folder_round_trip_through_the_tool(tmp_path, spm, capsys):
  """from_hf and to_hf (the CLI) on a ModernBertForMaskedLM folder: the export loads in AutoModelForMaskedLM
  with no missing or unexpected keys, and both it and our restored model give the original's logits."""
  torch.manual_seed(0)
  hcfg = transformers.ModernBertConfig(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
      global_attn_every_n_layers=2, local_attention=4, max_position_embeddings=40, pad_token_id=1, bos_token_id=0,
      eos_token_id=2, cls_token_id=0, sep_token_id=2, attn_implementation="eager")
  model = transformers.ModernBertForMaskedLM(hcfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  src = _save_hf(model, tmp_path / "hf", spm["xlmr"])
  assert convert_checkpoint.main(["from_hf", f"--hf_dir={src}", f"--out={tmp_path / 'ours'}"]) == 0
  assert f"--config.init_from={tmp_path / 'ours'}" in capsys.readouterr().out   # all it takes to continue
  from mlm_jax.workdir import files as workdir_files
  assert workdir_files.read_config(str(tmp_path / "ours")).model.first_layer_attention_norm is False
  assert convert_checkpoint.main(["to_hf", f"--workdir={tmp_path / 'ours'}", f"--out={tmp_path / 'back'}"]) == 0
  assert "(modernbert, step 0)" in capsys.readouterr().out
  reloaded, info = transformers.AutoModelForMaskedLM.from_pretrained(
      str(tmp_path / "back"), output_loading_info=True, attn_implementation="eager")
  assert type(reloaded) is type(model)
  assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
  assert reloaded.config.layer_types == hcfg.layer_types and reloaded.config.local_attention == 4

  ids, mask, _ = _padded_batch("modernbert", 1)
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    got_hf = reloaded.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  lm = fill_mask.from_workdir(str(tmp_path / "ours"))
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  hidden = lm.model(jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32), jnp.asarray(positions, jnp.int32))
  real = mask.astype(bool)
  np.testing.assert_array_equal(got_hf[real], want[real])
  np.testing.assert_allclose(np.asarray(lm.model.mlm_logits(hidden))[real], want[real], atol=1e-4, rtol=0)


def test_from_hf_output_is_what_init_from_loads(tmp_path, spm):
  """restore.restore_params (config.init_from) reads the from_hf checkpoint in a fresh manager."""
  from mlm_jax.workdir import files as workdir_files
  from mlm_jax.model.encoder import abstract_model
  model = _hf_model("xlm-roberta")
  src = _save_hf(model, tmp_path / "hf")
  out = tmp_path / "ours"
  summary = folders.from_hf(str(src), str(out), tokenizer=spm["xlmr"].model_path)
  config = workdir_files.read_config(str(out))
  assert config.init_from == str(out) and config.data.tokenizer == summary["tokenizer"]
  assert summary["train_flags"] == [f"--config.init_from={out}"] and not summary["fresh_head"]
  _, abstract = abstract_model(config.model)
  params, _ = restore.restore_params(str(out), restore.single_device(abstract))
  ref = model.state_dict()["roberta.embeddings.word_embeddings.weight"].numpy()
  np.testing.assert_array_equal(np.asarray(params["word_embeddings"][...]), ref)
  # NSP / SOP on top of a source without a pooler and sentence head (a *ForMaskedLM): those start fresh
  nsp = config.model.copy_and_resolve_references()
  nsp.use_pooler = nsp.sentence_head = True
  _, abstract = abstract_model(nsp)
  abstract = restore.single_device(abstract)
  with pytest.raises(restore.CheckpointError, match="has no array params.pooler_bias"):
    restore.restore_params_for(str(out), nsp, abstract)
  for scan in (False, True):   # True: the source's layers are restacked on the way in
    nsp.scan_layers = scan
    _, abstract = abstract_model(nsp)
    abstract = restore.single_device(abstract)
    fresh = jax.tree.map(lambda a: np.full(a.shape, 0.5, a.dtype), abstract)
    got = restore.restore_params_for(str(out), nsp, abstract, fresh=fresh)
    assert jax.tree.structure(got) == jax.tree.structure(abstract)
    np.testing.assert_array_equal(np.asarray(got["word_embeddings"][...]), ref)
    assert all((np.asarray(got[k][...]) == 0.5).all() for k in restore.OBJECTIVE_PARAMS)

  # --config.init_from is all it takes: the demo config's model is replaced by the source's, silently;
  # a run-time field stays the user's; a command-line model flag that contradicts the source is refused.
  from mlm_jax.training import resolve
  from mlm_jax.config.defaults import default_config
  from mlm_jax.errors import ConfigError
  demo = default_config()   # a 4-layer, 256-wide model: the source's 2 x 32 replaces it
  demo.init_from, demo.model.dtype, demo.data.seq_len = str(out), "bfloat16", 32
  run = tmp_path / "run"
  r = resolve.resolve_pretraining(demo, str(run), {"model.hidden_size": 32,
                                                   "data.tokenizer": spm["xlmr"].model_path})
  resolved, tok = r.config, r.tokenizer
  assert resolved.init_from == str(out) and resolved.data.tokenizer == summary["tokenizer"]
  assert tok.vocab_size == model.config.vocab_size
  for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "type_vocab_size", "position_offset",
              "layer_norm_eps", "max_position_embeddings", "vocab_size"):
    assert resolved.model[key] == config.model[key], key
  assert resolved.model.dtype == "bfloat16" and resolved.masking.mask_id == tok.mask_id
  with pytest.raises(ConfigError, match=r"--config.model.num_layers=3 contradicts init_from=.*model.num_layers=2"):
    resolve.resolve_pretraining(demo, str(run), {"model.num_layers": 3})
  # A transformers folder is converted into WORKDIR/init_model by provisioning (resolution only reads);
  # this one carries no tokenizer, so the user's data.tokenizer is kept.
  from mlm_jax.training import provision
  demo.init_from, demo.data.tokenizer = str(src), spm["xlmr"].model_path
  with pytest.raises(ConfigError, match=r"is a transformers folder not converted yet into .*init_model"):
    resolve.resolve_pretraining(demo, str(run), {})
  provision.pretraining(demo, str(run), {})
  resolved = resolve.resolve_pretraining(demo, str(run), {}).config
  assert resolved.init_from == str(run / "init_model") and resolved.model.num_layers == 2


def test_pytorch_bin_only_through_weights_only(tmp_path, spm):
  model = _hf_model("bert")
  src = tmp_path / "hf"
  src.mkdir()
  model.config.to_json_file(str(src / "config.json"))
  torch.save(model.state_dict(), str(src / "pytorch_model.bin"))
  summary = folders.from_hf(str(src), str(tmp_path / "ok"), tokenizer=spm["bert"].model_path)
  assert summary["weights"].endswith("pytorch_model.bin")

  # A pickle that would run code when unpickled is refused, and never runs.
  marker = tmp_path / "pwned"
  bad = tmp_path / "bad"
  bad.mkdir()
  model.config.to_json_file(str(bad / "config.json"))
  with open(bad / "pytorch_model.bin", "wb") as f:
    pickle.dump(_Exploit(str(marker)), f, protocol=2)
  with pytest.raises(folders.ConversionError, match="weights_only=True"):
    folders.from_hf(str(bad), str(tmp_path / "bad_out"))
  assert not marker.exists()


class _Exploit:
  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return (open, (self.path, "w"))


def _cli(capsys, *argv):
  capsys.readouterr()   # drop what came before (transformers' progress bars)
  code = convert_checkpoint.main(list(argv))
  err = capsys.readouterr().err.strip().splitlines()
  return code, err


def test_errors_are_one_line(tmp_path, spm, capsys):
  model = _hf_model("xlm-roberta")
  src = _save_hf(model, tmp_path / "hf", spm["xlmr"])

  # Unknown architecture: in an HF config, and as --arch.
  odd = tmp_path / "odd"
  odd.mkdir()
  (odd / "config.json").write_text(json.dumps(dict(model.config.to_dict(), model_type="gpt2")))
  code, err = _cli(capsys, "from_hf", f"--hf_dir={odd}", f"--out={tmp_path / 'o1'}")
  assert code == 2 and len(err) == 1 and "unknown architecture" in err[0] and "gpt2" in err[0], err
  ours = tmp_path / "ours"
  assert _cli(capsys, "from_hf", f"--hf_dir={src}", f"--out={ours}")[0] == 0
  code, err = _cli(capsys, "to_hf", f"--workdir={ours}", f"--out={tmp_path / 'o2'}", "--arch=electra")
  assert code == 2 and len(err) == 1 and "unknown architecture" in err[0] and "electra" in err[0], err

  # Missing files: config.json, weights, the workdir's config and tokenizer.
  empty = tmp_path / "empty"
  empty.mkdir()
  code, err = _cli(capsys, "from_hf", f"--hf_dir={empty}", f"--out={tmp_path / 'o3'}")
  assert code == 2 and "config.json" in err[0] and "missing" in err[0], err
  (empty / "config.json").write_text(json.dumps(model.config.to_dict()))
  code, err = _cli(capsys, "from_hf", f"--hf_dir={empty}", f"--out={tmp_path / 'o4'}")
  assert code == 2 and "model.safetensors" in err[0], err
  code, err = _cli(capsys, "to_hf", f"--workdir={tmp_path / 'nowhere'}", f"--out={tmp_path / 'o5'}")
  assert code == 2 and "nowhere" in err[0], err
  os.rename(ours / "tokenizer" / "spm.model", tmp_path / "moved.model")
  code, err = _cli(capsys, "to_hf", f"--workdir={ours}", f"--out={tmp_path / 'o6'}")
  assert code == 2 and "spm.model" in err[0] and "missing" in err[0], err
  os.rename(tmp_path / "moved.model", ours / "tokenizer" / "spm.model")
  code, err = _cli(capsys, "to_hf", f"--workdir={ours}", "--step=7", f"--out={tmp_path / 'o7'}")
  assert code == 2 and "step 7" in err[0], err

  # Vocabulary size against the tokenizer.
  other = _save_hf(_hf_model("xlm-roberta", vocab=VOCAB + 8), tmp_path / "hf_big")
  code, err = _cli(capsys, "from_hf", f"--hf_dir={other}", f"--out={tmp_path / 'o9'}",
                   f"--tokenizer={spm['xlmr'].model_path}")
  assert code == 2 and "vocab size mismatch" in err[0] and str(VOCAB + 8) in err[0] and str(VOCAB) in err[0], err

  # A tensor whose shape does not match the config: named, HF name and ours.
  sd = load_file(str(src / "model.safetensors"))
  name = "roberta.encoder.layer.1.intermediate.dense.weight"
  sd[name] = np.zeros((40, 32), np.float32)
  bad = tmp_path / "bad_shape"
  bad.mkdir()
  (bad / "config.json").write_text((src / "config.json").read_text())
  save_file(sd, str(bad / "model.safetensors"), metadata={"format": "pt"})
  code, err = _cli(capsys, "from_hf", f"--hf_dir={bad}", f"--out={tmp_path / 'o10'}")
  assert code == 2 and len(err) == 1 and name in err[0] and "(40, 32)" in err[0] and "(48, 32)" in err[0], err
  assert "layers.1.mlp.wi_kernel" in err[0]
  # None of the failed runs left an output folder behind.
  assert not any((tmp_path / f"o{i}").exists() for i in range(1, 11))


def test_never_writes_into_existing_output(tmp_path, spm, capsys):
  src = _save_hf(_hf_model("bert"), tmp_path / "hf", spm["bert"])
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("precious")
  code, err = _cli(capsys, "from_hf", f"--hf_dir={src}", f"--out={out}")
  assert code == 2 and "not empty" in err[0] and "--overwrite" in err[0], err
  assert sorted(os.listdir(out)) == ["keep.txt"]
  ours = tmp_path / "ours"
  assert _cli(capsys, "from_hf", f"--hf_dir={src}", f"--out={ours}")[0] == 0
  code, err = _cli(capsys, "to_hf", f"--workdir={ours}", f"--out={out}")
  assert code == 2 and "not empty" in err[0], err
  assert sorted(os.listdir(out)) == ["keep.txt"]
  # --overwrite writes the converted files next to what is there, and never replaces checkpoints.
  assert _cli(capsys, "to_hf", f"--workdir={ours}", f"--out={out}", "--overwrite")[0] == 0
  assert (out / "keep.txt").read_text() == "precious" and (out / "model.safetensors").exists()
  code, err = _cli(capsys, "from_hf", f"--hf_dir={src}", f"--out={ours}", "--overwrite")
  assert code == 2 and "checkpoints" in err[0], err


def test_fill_mask_errors(tmp_path, spm, capsys):
  tool = _tool("fill_mask")
  src = _save_hf(_hf_model("xlm-roberta"), tmp_path / "hf")   # weights only, no tokenizer files
  capsys.readouterr()
  assert tool.main([f"--hf_dir={src}", "a <mask> b"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "missing tokenizer" in err[0], err
  assert tool.main([f"--hf_dir={src}", f"--tokenizer={spm['xlmr'].model_path}", "no mask here"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "no mask token" in err[0], err
  assert tool.main([f"--workdir={tmp_path / 'nowhere'}", "a <mask> b"]) == 2
  assert "nowhere" in capsys.readouterr().err
  # With the tokenizer given, the same folder predicts: probabilities of a distribution.
  assert tool.main([f"--hf_dir={src}", f"--tokenizer={spm['xlmr'].model_path}", "a <mask> b", "--json"]) == 0
  preds = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"][0]["masks"][0]["predictions"]
  assert len(preds) == 5 and 0 < sum(p["probability"] for p in preds) <= 1
  assert all(a["probability"] >= b["probability"] for a, b in zip(preds, preds[1:]))
