"""A trained encoder plus its tokenizer, ready to predict masked tokens (tools/fill_mask.py).

From a workdir (restored onto one device) or a transformers folder (converted in memory and run by our
JAX model, so the tool checks the conversion too); text is tokenized as in training, each mask string
becoming the mask id, as the exported HF tokenizer does (docs/design_notes.md#fill_mask).
"""
from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import ml_collections

from mlm_jax.workdir import restore
from mlm_jax.workdir import files as workdir_files
from mlm_jax.convert import folders, tokenizer_files
from mlm_jax.errors import NoMaskedLM, UserError
from mlm_jax.data.tokenizers import base as tokenizer_base
from mlm_jax.objectives import registry

# Accepted in text for any layout, besides the tokenizer's own mask piece ("[MASK]" for BERT).
MASK_STRING = "<mask>"


@dataclasses.dataclass
class MaskedLM:
  model: object                      # mlm_jax.model.encoder.Encoder holding the parameters
  tokenizer: tokenizer_base.Tokenizer
  model_config: ml_collections.ConfigDict
  source: str                        # what was loaded, for messages
  shift: int = 0                     # a masked token at t is predicted at t - shift (the objective's prediction_shift)


def from_workdir(workdir: str, step: int | None = None, dtype: str = "") -> MaskedLM:
  """The run's masked LM: the tower its objective names (ELECTRA: the generator), from the latest or `step`;
  `dtype`: its compute dtype instead of the run's (the parameters stay as saved)."""
  config = workdir_files.config_at(workdir, step)
  if dtype:
    config.model.dtype = dtype
  objective = registry.for_config(config)
  path, mcfg = objective.masked_lm(config)
  tok = workdir_files.load_tokenizer(workdir_files.tokenizer_path(workdir, config), mcfg.vocab_size)
  from flax import nnx
  if not path:
    _refuse_discriminator(mcfg, workdir)
    graphdef, params, step = restore.restore_model(workdir, mcfg, step)
    return MaskedLM(nnx.merge(graphdef, params), tok, mcfg, f"{workdir} (step {step})", objective.prediction_shift)
  graphdef, params, step = restore.restore_objective(workdir, config, step)
  module = nnx.merge(graphdef, params)
  for name in path.split("."):
    module = getattr(module, name)
  return MaskedLM(module, tok, mcfg, f"{workdir} ({objective.__name__} {path}, step {step})",
                  objective.prediction_shift)


def _refuse_discriminator(mcfg: ml_collections.ConfigDict, where: str) -> None:
  if not mcfg.mlm_head:
    raise NoMaskedLM(f"{where} is an ELECTRA discriminator: it tells replaced tokens from original ones and has no "
                    "MLM head to fill masks; use the generator (to_hf's OUT/generator, or the ELECTRA run's workdir)")


def from_hf_dir(hf_dir: str, tokenizer: str | None = None, dtype: str = "") -> MaskedLM:
  """An HF folder run by our model; its tokenizer is the folder's (`tokenizer.load`), or `tokenizer`; `dtype`:
  the compute dtype instead of the default's."""
  from flax import nnx
  hcfg = folders.read_hf_config(hf_dir)
  mcfg = folders.model_config(hcfg)
  if dtype:
    mcfg.dtype = dtype
  _refuse_discriminator(mcfg, hf_dir)
  if tokenizer:
    tok = workdir_files.load_tokenizer(tokenizer, mcfg.vocab_size)
  else:
    tok = folders.folder_tokenizer(hf_dir)
    if tok is None:
      raise folders.ConversionError(f"{hf_dir}: missing tokenizer (no {tokenizer_files.SPM_FILE}, "
                                "sentencepiece.bpe.model, tokenizer.json, vocab.txt or vocab.json); "
                                "pass --tokenizer=PATH")
    if tok.vocab_size != mcfg.vocab_size:
      raise folders.ConversionError(f"vocab size mismatch: {hf_dir}/config.json has vocab_size={mcfg.vocab_size} "
                                f"but its tokenizer has {tok.vocab_size} pieces")
  sd, _ = folders.read_hf_weights(hf_dir)
  graphdef, params, fresh_head = folders.params_from_state_dict(sd, mcfg, hcfg["model_type"])
  if fresh_head:
    raise NoMaskedLM(f"{hf_dir} has no MLM head (a base or sentence-transformers model): fill-mask needs "
                              "one; continue pretraining from it first (--config.init_from)")
  return MaskedLM(nnx.merge(graphdef, jax.tree.map(jnp.asarray, params)), tok, mcfg, hf_dir,
                  int(hcfg.get(folders.SHIFT_KEY, 0)))


def encode_with_masks(tok: tokenizer_base.Tokenizer, text: str) -> tuple[list[int], list[int]]:
  """(ids with BOS/EOS, indices of the mask tokens); raises ValueError when the text has no mask."""
  strings = sorted({MASK_STRING, tok.mask_token}, key=len, reverse=True)
  parts = re.split("|".join(re.escape(s) for s in strings), text)
  if len(parts) == 1:
    raise UserError(f"no mask token in {text!r}: write {' or '.join(repr(s) for s in strings)} where a "
                    "token should be predicted")
  ids, masks = [tok.bos_id], []
  for i, part in enumerate(parts):
    if i:
      masks.append(len(ids))
      ids.append(tok.mask_id)
    if tok.mask_takes_left_space and i < len(parts) - 1:
      part = part.rstrip()   # RoBERTa's <mask> takes the space before it (lstrip), as HF encodes it
    ids += tok.encode(part)
  ids.append(tok.eos_id)
  return ids, masks


def fill_mask(lm: MaskedLM, text: str, top_k: int = 5) -> dict:
  """{'text', 'ids', 'masks': [{'position', 'predictions': [{'token', 'piece', 'id', 'probability'}]}]}."""
  tok, cfg = lm.tokenizer, lm.model_config
  ids, masks = encode_with_masks(tok, text)
  limit = cfg.max_position_embeddings - cfg.position_offset if cfg.positions == "learned" else None
  if limit is not None and len(ids) > limit:
    raise UserError(f"text is {len(ids)} tokens long; the model takes at most {limit}")
  x = jnp.asarray([ids], jnp.int32)
  hidden = lm.model(x, jnp.ones_like(x), jnp.arange(len(ids), dtype=jnp.int32)[None], None)
  logits = lm.model.mlm_logits(hidden[0, jnp.asarray(masks) - lm.shift])
  probs = np.asarray(jax.device_get(jax.nn.softmax(logits.astype(jnp.float32), axis=-1)))
  k = max(1, min(int(top_k), probs.shape[-1]))
  out = []
  for pos, p in zip(masks, probs):
    best = np.argsort(-p, kind="stable")[:k]
    out.append(dict(position=pos, predictions=[
        dict(token=tok.decode([int(i)]), piece=tok.id_to_piece(int(i)), id=int(i), probability=float(p[i]))
        for i in best]))
  return dict(text=text, ids=ids, masks=out)


def add_source_flags(parser) -> None:
  """The tools' flags naming a model to load: --workdir or --hf_dir (one of them), --step, --tokenizer."""
  src = parser.add_mutually_exclusive_group(required=True)
  src.add_argument("--workdir", help="training workdir (or a from_hf output folder)")
  src.add_argument("--hf_dir", help="transformers BERT / RoBERTa / XLM-R masked-LM folder, run by our model")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step of --workdir (default: the latest)")
  parser.add_argument("--tokenizer", default=None,
                      help="tokenizer (.model, tokenizer.json, vocab.txt or a folder) for an --hf_dir without one")


def load(workdir: str | None = None, hf_dir: str | None = None, step: int | None = None,
         tokenizer: str | None = None) -> MaskedLM:
  if bool(workdir) == bool(hf_dir):
    raise UserError("give exactly one of --workdir or --hf_dir")
  if workdir:
    return from_workdir(workdir, step)
  return from_hf_dir(hf_dir, tokenizer)

