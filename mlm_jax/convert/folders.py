"""Whole-folder conversion: a training workdir <-> a Hugging Face transformers masked-LM folder.

`to_hf` and `from_hf` around the tensor maps (bert.py, modernbert.py), tokenizers included. Everything
is read, converted and checked in memory before the first byte is written, and a non-empty output is
refused unless `overwrite`. What each folder holds: docs/design_notes.md#folders.
"""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import ml_collections

from mlm_jax.workdir import restore
from mlm_jax.workdir import checkpoints
from mlm_jax import errors
from mlm_jax.model import encoder
from mlm_jax.workdir import files as workdir_files
from mlm_jax.convert import electra_towers, bert, tokenizer_files, modernbert
from mlm_jax.data.tokenizers import base as tokenizer_base
from mlm_jax.data.tokenizers import hf_tokenizers
from mlm_jax.data.tokenizers import load as tokenizer_load
from mlm_jax.data.tokenizers import spm as tokenizer_spm
from mlm_jax.objectives import registry



ConversionError = errors.ConversionError
# config.json key of a model whose LM head predicts a masked token at t from position t - shift (GPT-BERT: 1);
# transformers keeps it as a config attribute, our readers (fill-mask, PLL) shift by it.
SHIFT_KEY = "prediction_shift"


def default_arch(model_cfg: ml_collections.ConfigDict) -> str:
  """ModernBERT for a model of its structure; else BERT when positions start at 0, else XLM-R
  (RoBERTa's code with a sentencepiece vocabulary)."""
  if modernbert.is_modernbert(model_cfg):
    return modernbert.ARCH
  return "bert" if model_cfg.position_offset == 0 else "xlm-roberta"


def _check_out(out: str, overwrite: bool) -> None:
  if os.path.exists(out) and not os.path.isdir(out):
    raise ConversionError(f"--out {out} exists and is not a directory")
  if os.path.isdir(out) and os.listdir(out) and not overwrite:
    raise ConversionError(f"--out {out} exists and is not empty; refusing to write into it (pass --overwrite "
                          "to replace the converted files, other files are kept)")


def to_hf(workdir: str, out: str, step: int | None = None, arch: str | None = None,
          overwrite: bool = False, ema: bool = False) -> dict:
  """Writes an HF folder from a workdir with the exporter of its objective's `export_kind` (EXPORTERS);
  returns a summary (step, arch, files). `ema`: the moving average of the parameters (train.ema_decay)
  instead of the parameters."""
  _check_out(out, overwrite)
  config = workdir_files.config_at(workdir, step)
  objective = registry.for_config(config)
  exporter = EXPORTERS.get(objective.export_kind)
  if exporter is None:
    raise ConversionError(f"{workdir}: objective {config.objective!r} exports as {objective.export_kind!r}; "
                          f"convert/folders.py has exporters for {', '.join(repr(k) for k in EXPORTERS)}")
  return exporter(workdir, out, config, objective, step, arch, ema)


def masked_lm_to_hf(workdir: str, out: str, config: ml_collections.ConfigDict, objective, step: int | None,
                    arch: str | None, ema: bool) -> dict:
  """The 'masked_lm' exporter: the objective's encoder and its MLM head as one BERT / RoBERTa / XLM-R /
  ModernBERT folder (BertForPreTraining with a BERT-layout sentence head)."""
  from safetensors.numpy import save_file
  subtree, mcfg = objective.encoder(config)
  tok = workdir_files.load_tokenizer(workdir_files.tokenizer_path(workdir, config), mcfg.vocab_size)
  arch = arch or ("roberta" if tok.family == "bpe" and mcfg.position_offset else default_arch(mcfg))
  if arch not in bert.ARCHS:
    raise ConversionError(f"unknown architecture --arch={arch!r}: expected one of {', '.join(bert.ARCHS)}")
  try:
    hcfg = bert.hf_config(mcfg, arch, pad_token_id=tok.pad_id, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id)
  except ValueError as e:
    raise ConversionError(str(e)) from None
  _, params, step = restore.restore_model(workdir, mcfg, step, subtree=subtree, item="ema" if ema else "params")
  state_dict = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in bert.params_to_hf(params, mcfg, arch).items()}
  if mcfg.type_vocab_size == 0 and arch != modernbert.ARCH:
    # Our model has no token types; transformers always adds one: a zero row changes nothing.
    prefix = "bert" if arch == "bert" else "roberta"
    state_dict[f"{prefix}.embeddings.token_type_embeddings.weight"] = np.zeros((1, mcfg.hidden_size), np.float32)
  hcfg.update(dtype="float32", mask_token_id=tok.mask_id)
  if objective.prediction_shift:
    hcfg[SHIFT_KEY] = objective.prediction_shift
  dropped = ""
  if mcfg.sentence_head:
    if arch == "bert":
      hcfg["architectures"] = ["BertForPreTraining"]   # MLM + NSP heads; AutoModelForMaskedLM loads it too
    else:
      dropped = (f"the sentence (NSP/SOP) head was dropped: transformers' {arch} has no class with one, "
                 "so the folder holds the MLM model")

  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
    json.dump(hcfg, f, indent=2, sort_keys=True)
  save_file(state_dict, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
  files = ["config.json", "model.safetensors"]
  if tok.family == "sentencepiece":
    files += tokenizer_files.write(tok, out, model_max_length=mcfg.max_position_embeddings - mcfg.position_offset)
  else:   # WordPiece / byte-level BPE: the original files are what AutoTokenizer reads
    files += write_tokenizer_files(tok, out)
  return dict(step=step, arch=arch, files=files, out=out, **({"note": dropped} if dropped else {}))


# The exporters by an objective's `export_kind` (objectives/interface.py): (workdir, out, config, objective
# description, step, arch, ema) -> summary; `out` is checked before. An objective with transformers classes
# of its own adds its exporter here.
EXPORTERS = {"masked_lm": masked_lm_to_hf, "electra": electra_towers.export}


# ------------------------------------------------------------------------------------------
# Their side: Hugging Face folders
# ------------------------------------------------------------------------------------------
def read_hf_config(hf_dir: str) -> dict:
  if not os.path.isdir(hf_dir):
    raise ConversionError(f"HF folder {hf_dir}: no such directory")
  path = os.path.join(hf_dir, "config.json")
  if not os.path.exists(path):
    raise ConversionError(f"{path}: missing (not a transformers model folder)")
  with open(path, encoding="utf-8") as f:
    try:
      hcfg = json.load(f)
    except json.JSONDecodeError as e:
      raise ConversionError(f"{path}: not valid JSON ({e})") from None
  if hcfg.get("model_type") not in bert.ARCHS + (electra_towers.ARCH,):
    raise ConversionError(f"{path}: unknown architecture model_type={hcfg.get('model_type')!r}: expected one "
                          f"of {', '.join(bert.ARCHS + (electra_towers.ARCH,))}")
  return hcfg


def _to_numpy(t) -> np.ndarray:
  """A torch tensor as numpy; bfloat16/float16 become float32 (our parameters are float32)."""
  t = t.detach().cpu()
  return (t.float() if t.is_floating_point() else t).numpy()


def _read_safetensors(path: str) -> dict:
  from safetensors import safe_open
  out = {}
  try:
    with safe_open(path, framework="numpy") as f:
      for k in f.keys():
        out[k] = f.get_tensor(k)
  except (TypeError, ValueError):  # bfloat16 has no numpy dtype: go through torch
    with safe_open(path, framework="pt") as f:
      for k in f.keys():
        out[k] = _to_numpy(f.get_tensor(k))
  return out


def read_hf_weights(hf_dir: str) -> tuple[dict, str]:
  """{tensor name: numpy array} and the file(s) read; pickle only via torch.load(weights_only=True)."""
  single = os.path.join(hf_dir, "model.safetensors")
  index = os.path.join(hf_dir, "model.safetensors.index.json")
  binary = os.path.join(hf_dir, "pytorch_model.bin")
  if os.path.exists(single):
    return _read_safetensors(single), single
  if os.path.exists(index):
    with open(index, encoding="utf-8") as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for shard in shards:
      p = os.path.join(hf_dir, shard)
      if not os.path.exists(p):
        raise ConversionError(f"{p}: missing (listed in {index})")
      out.update(_read_safetensors(p))
    return out, index
  if os.path.exists(binary):
    import torch
    try:
      sd = torch.load(binary, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - an unsafe or corrupt pickle: one line, never executed
      raise ConversionError(f"{binary}: cannot be read with torch.load(weights_only=True): "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return {k: _to_numpy(v) for k, v in sd.items() if hasattr(v, "detach")}, binary
  raise ConversionError(f"{hf_dir}: missing model.safetensors (or model.safetensors.index.json / "
                        "pytorch_model.bin)")


def _canonical_names(sd: dict, arch: str) -> dict:
  """Older checkpoints' spellings (LayerNorm gamma/beta, the MLM bias under `decoder`) -> today's."""
  if arch not in bert.BERT_ARCHS:   # the BERT family's table (ModernBERT has its own names)
    return dict(sd)
  out = {}
  prefix = "bert" if arch == "bert" else "roberta"
  if not any(k.startswith(prefix + ".") for k in sd):   # saved from a base model (BertModel): no prefix
    sd = {(k if k.startswith(("cls.", "lm_head.")) else f"{prefix}.{k}"): v for k, v in sd.items()}
  for k, v in sd.items():
    if k.endswith(".gamma"):
      k = k[:-len("gamma")] + "weight"
    elif k.endswith(".beta"):
      k = k[:-len("beta")] + "bias"
    out[k] = v
  bias = "cls.predictions.bias" if arch == "bert" else "lm_head.bias"
  decoder_bias = "cls.predictions.decoder.bias" if arch == "bert" else "lm_head.decoder.bias"
  if bias not in out and decoder_bias in out:
    out[bias] = out[decoder_bias]
  return out


def folder_tokenizer(hf_dir: str) -> tokenizer_base.Tokenizer | None:
  """The tokenizer a transformers folder carries (`tokenizer.load`'s choice), or None without one."""
  names = (tokenizer_spm.SPM_FILE, tokenizer_spm.FAIRSEQ_FILE) + hf_tokenizers.MAIN_FILES
  if not any(os.path.exists(os.path.join(hf_dir, n)) for n in names):
    return None
  try:
    return tokenizer_load.load(hf_dir)
  except errors.DataError as e:
    raise ConversionError(str(e)) from None


def write_tokenizer_files(tok: tokenizer_base.Tokenizer, folder: str) -> list[str]:
  """Writes `tok.files()` into `folder` (a from_hf output's tokenizer/, an exported HF folder)."""
  os.makedirs(folder, exist_ok=True)
  for name, data in tok.files().items():
    with open(os.path.join(folder, name), "wb") as f:
      f.write(data)
  return sorted(tok.files())


def model_config(hcfg: dict) -> ml_collections.ConfigDict:
  from mlm_jax.config.defaults import default_config
  try:
    if hcfg.get("model_type") == electra_towers.ARCH:
      return electra_towers.model_config_from_hf(hcfg, default_config().model)
    return bert.model_config_from_hf(hcfg, default_config().model)
  except (KeyError, ValueError) as e:
    raise ConversionError(f"HF config.json: {e}") from None


# Our MLM head's parameters: a checkpoint may lack all of them (a base model), never some.
_HEAD = ("head_kernel", "head_bias", "head_norm.scale", "head_norm.bias", "decoder_bias")


def _add_fresh_head(sd: dict, mcfg: ml_collections.ConfigDict, arch: str) -> bool:
  """A base-model checkpoint (sentence-transformers: BertModel, no MLM head) gets a freshly initialized
  head, as transformers' *ForMaskedLM.from_pretrained would; returns whether it did."""
  if arch not in bert.BERT_ARCHS:
    return False   # ModernBERT: its converter names every tensor it needs
  rows = [(ours, theirs, to_hf) for ours, theirs, _, to_hf in bert.mapping(mcfg, arch) if ours in _HEAD]
  if any(theirs in sd for _, theirs, _ in rows):
    return False
  from flax import nnx
  flat = bert.flatten(nnx.state(encoder.Encoder(mcfg, seed=0), nnx.Param))
  for ours, theirs, to_hf in rows:
    sd[theirs] = np.asarray(to_hf(flat[ours]))
  return True


def params_from_state_dict(sd: dict, mcfg: ml_collections.ConfigDict, arch: str):
  """(graphdef, params, fresh_head) from an HF state dict, every tensor's presence and shape checked by name."""
  if arch == electra_towers.ARCH:   # one tower: the generator (with MLM head) or the discriminator (without)
    graphdef, abstract = encoder.abstract_model(mcfg)
    kind = electra_towers.GENERATOR if mcfg.mlm_head else electra_towers.DISCRIMINATOR
    return graphdef, electra_towers.params_from_hf(sd, mcfg, kind, abstract), False
  sd = _canonical_names(sd, arch)
  # Checkpoints saved from *ForPreTraining / base models carry the pooler; keep it (fine-tuning
  # heads use it as BERT does). *ForMaskedLM checkpoints have none.
  if f"{'bert' if arch == 'bert' else 'roberta'}.pooler.dense.weight" in sd:
    mcfg.use_pooler = True
    # BertForPreTraining's NSP head (bert-base-uncased's checkpoint has it): kept for mlm+nsp runs
    mcfg.sentence_head = arch == "bert" and "cls.seq_relationship.weight" in sd
  fresh_head = _add_fresh_head(sd, mcfg, arch)
  graphdef, abstract = encoder.abstract_model(mcfg)
  try:
    return graphdef, bert.params_from_hf(sd, mcfg, arch, abstract), fresh_head
  except (KeyError, ValueError) as e:
    raise ConversionError(e.args[0] if e.args else str(e)) from None


def from_hf(hf_dir: str, out: str, tokenizer: str | None = None, overwrite: bool = False) -> dict:
  """Writes OUT/{config.json, checkpoints/0, tokenizer/}; returns a summary with the train flags."""
  from mlm_jax.config.defaults import default_config
  _check_out(out, overwrite)
  ckpt_dir = os.path.join(out, "checkpoints")
  if os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir):
    # Even with --overwrite: checkpoints are never deleted by a conversion (it may be a training workdir).
    raise ConversionError(f"{ckpt_dir} exists and is not empty; refusing to replace checkpoints (remove it "
                          "yourself or choose another --out)")
  hcfg = read_hf_config(hf_dir)
  arch = hcfg["model_type"]
  mcfg = model_config(hcfg)
  sd, source = read_hf_weights(hf_dir)
  _, params, fresh_head = params_from_state_dict(sd, mcfg, arch)

  tok = workdir_files.load_tokenizer(tokenizer, mcfg.vocab_size) if tokenizer else folder_tokenizer(hf_dir)
  if tok is not None and tok.vocab_size != mcfg.vocab_size:
    raise ConversionError(f"vocab size mismatch: {hf_dir}/config.json has vocab_size={mcfg.vocab_size} but "
                          f"its {tok.family} tokenizer has {tok.vocab_size} pieces")

  config = default_config()
  config.model.update(mcfg.to_dict())
  config.init_from = os.path.abspath(out)
  tok_dir = os.path.join(os.path.abspath(out), "tokenizer")
  tok_path = os.path.join(tok_dir, tok.main_file) if tok is not None else None
  if tok is not None:
    config.data.tokenizer = tok_path
    config.tokenizer.layout = tok.layout
  config.tokenizer.vocab_size = mcfg.vocab_size

  os.makedirs(out, exist_ok=True)
  if tok is not None:
    write_tokenizer_files(tok, tok_dir)
    workdir_files.load_tokenizer(tok_path, mcfg.vocab_size)   # the written files load and agree
  ckpt = checkpoints.Checkpointer(out, keep=1, async_save=False)
  state = {"params": jax.tree.map(jnp.asarray, params), "step": jnp.zeros((), jnp.int32)}
  ckpt.save(0, state, {"from_hf": os.path.abspath(hf_dir), "weights": os.path.basename(source)})
  ckpt.close()
  workdir_files.write_config(config, out)
  flags = [f"--config.init_from={config.init_from}"]   # the model and tokenizer come from there
  return dict(arch=arch, out=out, weights=source, tokenizer=tok_path, train_flags=flags, fresh_head=fresh_head)
