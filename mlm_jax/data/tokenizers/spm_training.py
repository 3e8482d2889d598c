"""Sentencepiece training with language-balanced sampling, in our special-token layouts.

Language i gets a share q_i ∝ n_i^alpha of the trainer's sentences (XLM-R: alpha 0.3); xlmr's `<mask>` is
appended last as a CONTROL piece, bert's `[MASK]` is id 4 (why: docs/design_notes.md#spm_training).
"""
from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from typing import Callable, Mapping, Optional, Sequence, Union

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from mlm_jax.config import choices
from mlm_jax import runtime
from mlm_jax.data import specs
from mlm_jax.data.tokenizers import base as tokenizer_base, load as tokenizer_load
from mlm_jax.errors import DataError

# Lines longer than this (bytes) are cut before training: sentencepiece silently drops them.
_MAX_TRAIN_LINE_BYTES = 16384


def language_groups(inputs: Union[Sequence[str], Mapping[str, str]]) -> dict:
  """Groups input specs into languages: {name: [spec, ...]}.

  `inputs` is a mapping name -> spec, or a list where each item is `name=spec` or a bare glob.
  A bare glob is split into one group per value of its first wildcard path component, so
  `corpus/*/*.gz` yields one group per language folder.
  """
  if isinstance(inputs, Mapping):
    return {k: [v] for k, v in inputs.items()}
  groups = {}
  for item in inputs:
    name, spec = specs.split_named(item)
    if name:
      groups.setdefault(name, []).append(spec)
      continue
    parsed = specs.parse_spec(spec)
    kind, pattern = parsed.kind, parsed.pattern
    if kind not in specs.TEXT_KINDS:
      groups.setdefault(spec, []).append(spec)
      continue
    for path in specs.list_files(pattern, owner=spec):
      groups.setdefault(_wildcard_key(pattern, path), []).append(
          spec.replace(pattern, _glob_escape(path)))
  return groups


def _glob_escape(path: str) -> str:
  return "".join(f"[{c}]" if c in "*?[" else c for c in path)


def _wildcard_key(pattern: str, path: str) -> str:
  parts, got = pattern.split("/"), path.split("/")
  for i, part in enumerate(parts):
    if any(c in part for c in "*?[") and i < len(got):
      return got[i]
  return path


def train(inputs: Union[Sequence[str], Mapping[str, str]],
          out_prefix: str,
          *,
          vocab_size: int = 32000,
          layout: str = "xlmr",
          model_type: str = "unigram",
          alpha: float = 0.3,
          max_sentences_per_language: int = 1_000_000,
          input_sentence_size: int = 2_000_000,
          character_coverage: float = 0.9995,
          byte_fallback: bool = True,
          seed: int = 0,
          num_threads: int = 0,
          verbose: bool = True,
          log: Optional[Callable[[str], None]] = None,
          spm_log: Optional[str] = "") -> tokenizer_base.Tokenizer:
  """Trains a sentencepiece model with language-balanced sampling; returns it loaded.

  Args:
    inputs: corpora, see `language_groups` (specs as in `data.sources`: text globs, `tsv:FIELD:GLOB`,
      `jsonl:FIELD:GLOB`).
    out_prefix: writes `<out_prefix>.model`, `.vocab` and `.special_ids.json`.
    vocab_size: total size including every special token.
    layout: 'xlmr' (also RoBERTa) or 'bert'.
    model_type: 'unigram' (XLM-R, ALBERT) or 'bpe'.
    alpha: language sampling exponent, q_i ∝ n_i^alpha (1.0 = proportional, 0 = uniform).
    max_sentences_per_language: per-language budget of lines kept in memory (a uniform
      reservoir sample; n_i still counts every line).
    input_sentence_size: total number of lines given to the trainer.
    character_coverage: sentencepiece's; keep < 1 for CJK-heavy mixes.
    byte_fallback: unknown characters become UTF-8 byte pieces instead of <unk>.
    seed: sampling seed (the trainer itself is deterministic for a given input).
    num_threads: trainer threads (0 = all cores).
    verbose: print progress (ours and sentencepiece's) to stderr.
    log: progress sink; default prints to stderr when verbose.
    spm_log: where sentencepiece's own trainer log (hundreds of lines) goes: '' = `<out_prefix>.train.log`,
      None = stderr (when verbose).
  """
  choices.check("tokenizer.layout", layout)
  choices.check("tokenizer.model_type", model_type)
  if log is None:
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if verbose else (lambda s: None)
  rng = random.Random(seed)
  counts, samples = _sample_languages(language_groups(inputs), max_sentences_per_language, rng, log)
  weights = {k: float(n) ** alpha for k, n in counts.items()}
  total_w = sum(weights.values())
  budget = min(input_sentence_size, sum(len(v) for v in samples.values()))
  mixture_path = None
  try:
    mixture_path = _write_mixture(samples, {k: w / total_w for k, w in weights.items()}, budget, rng, log)
    if spm_log == "":
      spm_log = out_prefix + ".train.log"
    t0 = time.time()
    log(f"[tokenizer] training a {vocab_size}-piece sentencepiece {model_type} model on {budget} lines"
        + (f" (its log: {spm_log})" if spm_log else ""))
    _train_spm(mixture_path, out_prefix, vocab_size, layout, model_type, character_coverage,
               byte_fallback, num_threads, verbose, spm_log)
    log(f"[tokenizer] trained in {time.time() - t0:.1f}s")
  finally:
    if mixture_path:
      os.remove(mixture_path)

  ids = _add_layout_pieces(out_prefix, layout, vocab_size)
  ids["languages"] = {k: dict(lines=counts[k], weight=weights[k] / total_w) for k in counts}
  ids["alpha"] = alpha
  return _write_special_ids(out_prefix + ".model", ids, vocab_size, log)


def _sample_languages(groups: dict, cap: int, rng, log) -> tuple:
  """({language: lines}, {language: a uniform sample of at most `cap` of its lines})."""
  if not groups:
    raise DataError("no tokenizer training inputs given")
  from mlm_jax.data.text import sources  # noqa: F401  TensorFlow, imported before the first reading is timed
  counts, samples = {}, {}
  for name, group in sorted(groups.items()):
    t0 = time.time()
    n, keep = _reservoir(group, cap, rng)
    if n == 0:
      raise DataError(f"tokenizer input {name!r} ({', '.join(group)}) has no text lines")
    counts[name], samples[name] = n, keep
    log(f"[tokenizer] read {name}: {n} lines ({len(keep)} kept) in {time.time() - t0:.1f}s")
  return counts, samples


def _write_special_ids(model_path: str, ids: dict, vocab_size: int, log) -> tokenizer_base.Tokenizer:
  """Writes `<prefix>.special_ids.json` beside the model; returns the model loaded with them."""
  with open(tokenizer_base.special_ids_path(model_path), "w", encoding="utf-8") as f:
    json.dump(ids, f, indent=1, sort_keys=True)
  tok = tokenizer_load.load(model_path)
  assert tok.vocab_size == vocab_size, (tok.vocab_size, vocab_size)
  log(f"[tokenizer] wrote {model_path} (vocab {vocab_size}, layout {ids['layout']}, "
      f"specials {tok.special_ids})")
  return tok


def _write_mixture(samples: dict, q: dict, budget: int, rng, log) -> str:
  """A temporary file of `budget` lines, q[name] of them from each language (up- or subsampled)."""
  fd, path = tempfile.mkstemp(prefix="spm_input_", suffix=".txt")
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    for name in sorted(samples):
      k = max(1, round(budget * q[name]))
      pool = samples[name]
      picked = rng.sample(pool, k) if k <= len(pool) else [rng.choice(pool) for _ in range(k)]
      log(f"[tokenizer] {name}: q={q[name]:.3f} -> {k} lines "
          f"({'up' if k > len(pool) else 'sub'}sampled from {len(pool)})")
      for line in picked:
        f.write(line + "\n")
  return path


def _add_layout_pieces(out_prefix: str, layout: str, vocab_size: int) -> dict:
  """Appends XLM-R's <mask> as the last piece (model and .vocab); returns the layout's special ids."""
  model_path = out_prefix + ".model"
  pieces = tokenizer_base.PIECES[layout]
  if layout == "xlmr":
    _append_control_piece(model_path, pieces["mask"])
    ids = dict(layout=layout, bos_id=0, pad_id=1, eos_id=2, unk_id=3, mask_id=vocab_size - 1)
    with open(out_prefix + ".vocab", "a", encoding="utf-8") as f:
      f.write(f"{pieces['mask']}\t0\n")
  else:
    ids = dict(layout=layout, pad_id=0, unk_id=1, bos_id=2, eos_id=3, mask_id=4)
  return ids


def _reservoir(group, cap, rng):
  """(number of lines, uniform sample of at most `cap` of them) over all specs of a language."""
  from mlm_jax.data.text import sources  # TensorFlow, only when training
  n, keep = 0, []
  for spec in group:
    ds = sources.text_lines(specs.parse_spec(spec), owner=spec)
    for raw in sources.numpy_elements(ds):   # the same lines in the same order, 12x faster than one by one
      line = raw.decode("utf-8").strip()
      if not line:
        continue
      if len(raw) > _MAX_TRAIN_LINE_BYTES:
        line = raw[:_MAX_TRAIN_LINE_BYTES].decode("utf-8", errors="ignore").strip()
      n += 1
      if len(keep) < cap:
        keep.append(line)
      else:
        j = rng.randrange(n)
        if j < cap:
          keep[j] = line
  return n, keep


def _train_spm(input_path, out_prefix, vocab_size, layout, model_type, character_coverage,
               byte_fallback, num_threads, verbose, spm_log):
  pieces = tokenizer_base.PIECES[layout]
  if layout == "xlmr":
    special = dict(bos_id=0, pad_id=1, eos_id=2, unk_id=3, control_symbols=[])
    n_pieces = vocab_size - 1  # <mask> is appended last afterwards
  else:
    special = dict(pad_id=0, unk_id=1, bos_id=2, eos_id=3, control_symbols=[pieces["mask"]])
    n_pieces = vocab_size
  out_dir = os.path.dirname(os.path.abspath(out_prefix))
  os.makedirs(out_dir, exist_ok=True)
  args = (input_path, out_prefix, n_pieces, model_type, character_coverage, byte_fallback, num_threads)
  try:
    if spm_log:
      with runtime.stderr_to(spm_log):
        _spm_train(*args, True, pieces, special)
    else:
      _spm_train(*args, verbose, pieces, special)
  except RuntimeError as e:
    msg = _first_line_of(e)
    if "Vocabulary size too high" in msg:
      raise DataError(f"vocab_size={vocab_size} is too large for this training text: "
                      f"{msg.split(') ', 1)[-1]}") from None
    raise


def _first_line_of(e):
  return str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__


def _spm_train(input_path, out_prefix, n_pieces, model_type, character_coverage, byte_fallback,
               num_threads, verbose, pieces, special):
  spm.SentencePieceTrainer.train(
      input=input_path, model_prefix=out_prefix, vocab_size=n_pieces, model_type=model_type,
      character_coverage=character_coverage, byte_fallback=byte_fallback,
      bos_piece=pieces["bos"], eos_piece=pieces["eos"], pad_piece=pieces["pad"],
      unk_piece=pieces["unk"], input_sentence_size=0, shuffle_input_sentence=False,
      max_sentence_length=_MAX_TRAIN_LINE_BYTES, train_extremely_large_corpus=False,
      num_threads=num_threads or os.cpu_count() or 1, minloglevel=0 if verbose else 2,
      hard_vocab_limit=True, **special)


def _append_control_piece(model_path: str, piece: str) -> None:
  proto = sentencepiece_model_pb2.ModelProto()
  with open(model_path, "rb") as f:
    proto.ParseFromString(f.read())
  p = proto.pieces.add()
  p.piece, p.score, p.type = piece, 0.0, sentencepiece_model_pb2.ModelProto.SentencePiece.CONTROL
  proto.trainer_spec.vocab_size = len(proto.pieces)
  with open(model_path, "wb") as f:
    f.write(proto.SerializeToString())
