"""tools/evaluate.py mlm: masked-LM metrics with fixed masks, and PLL checked against a direct computation.

Runs on a tiny randomly initialized workdir written in the test (config.json + an orbax checkpoint +
the session's sentencepiece model), so it needs no pretraining run.
"""
import json
import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools"))
import evaluate  # noqa: E402


@pytest.fixture(scope="module")
def workdir(corpus_and_tokenizer, tmp_path_factory):
  from flax import nnx
  from mlm_jax.workdir import checkpoints
  from mlm_jax.data.tokenizers import load as tokenizer_load
  from mlm_jax.config.defaults import default_config
  from mlm_jax.model.encoder import Encoder
  corpus, spm = corpus_and_tokenizer
  tok = tokenizer_load.load(spm)
  c = default_config()
  c.data.tokenizer = spm
  c.model.update(dict(vocab_size=tok.vocab_size, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                      max_position_embeddings=66, type_vocab_size=1, position_offset=2, layer_norm_eps=1e-5))
  wd = tmp_path_factory.mktemp("evaluate") / "run"
  params = nnx.state(Encoder(c.model, seed=3), nnx.Param)
  ckpt = checkpoints.Checkpointer(str(wd), async_save=False)
  ckpt.save(7, {"params": params}, {})
  ckpt.close()
  (wd / "config.json").write_text(c.to_json_best_effort())
  lines = [l for l in pathlib.Path(corpus).read_text().splitlines() if len(l.split()) > 4][:24]
  (wd.parent / "held_out.txt").write_text("\n".join(lines) + "\n")
  return wd


def _run(capsys, *argv):
  code = evaluate.main(["mlm", *argv])
  out, err = capsys.readouterr()
  return code, out, err


def test_mlm_metrics_and_pll(workdir, capsys):
  data = str(workdir.parent / "held_out.txt")
  args = [f"--workdir={workdir}", f"--data={data}", "--seq_len=32", "--batch_size=8", "--max_lines=16",
          "--pll_lines=2"]
  code, out, err = _run(capsys, *args)
  assert code == 0, err
  r = json.loads(out.strip().splitlines()[-1])
  assert r["sequences"] == 16 and r["num_predictions"] > 16 and "(step 7)" in r["source"]
  assert math.isfinite(r["loss"]) and r["perplexity"] == pytest.approx(math.exp(r["loss"]), rel=1e-5)
  assert 0.0 <= r["accuracy"] <= 1.0
  # An untrained model is about as unsure as a uniform guess over the 1000 pieces.
  assert 0.5 * math.log(1000) < r["loss"] < 2 * math.log(1000)
  assert r["pll_sequences"] == 2 and r["pseudo_perplexity"] == pytest.approx(math.exp(-r["pll"] / r["pll_tokens"]))
  # Fixed masks: the same command gives the same numbers.
  code, out2, _ = _run(capsys, *args)
  assert json.loads(out2.strip().splitlines()[-1]) == r


def _direct_pll(lm, seq, units, shift=0) -> float:
  """PLL of one sentence by one forward pass per unit: (positions masked, positions scored), or a list of
  positions both masked and scored; each scored token read from the position `shift` before it."""
  import jax
  import jax.numpy as jnp
  total = 0.0
  for unit in units:
    masked, scored = unit if isinstance(unit, tuple) else (unit, unit)
    x = list(seq)
    for i in masked:
      x[i] = lm.tokenizer.mask_id
    ids = jnp.asarray([x], jnp.int32)
    hidden = lm.model(ids, jnp.ones_like(ids), jnp.arange(len(x))[None])
    logp = jax.nn.log_softmax(lm.model.mlm_logits(hidden[0]))
    total += sum(float(logp[i - shift, seq[i]]) for i in scored)
  return total


@pytest.fixture(scope="module")
def pll_case(workdir):
  """The fixture's model, a few real sentences of different lengths, and its transformers export."""
  from mlm_jax.evaluation import fill_mask
  lm = fill_mask.from_workdir(str(workdir))
  rows = evaluate.sequences(lm.tokenizer, [str(workdir.parent / "held_out.txt")], 32, max_lines=6)
  tok = lm.tokenizer
  return lm, [[tok.bos_id] + r[1:n] + [tok.eos_id] for r, n in zip(rows, (5, 13, 8, 20, 3, 11))]


def test_packed_pll_equals_unpacked_and_transformers(pll_case, workdir, tmp_path):
  """Packed rows (segment ids, positions restarting per copy) give each sentence exactly the PLL of one copy
  per row, also packed a sentence at a time (the chunks that bound memory on large sets), and transformers'
  AutoModelForMaskedLM of the to_hf export agrees on the same ids to 1e-4."""
  import numpy as np
  from flax import nnx
  from mlm_jax.convert import folders
  from mlm_jax.evaluation import pll
  lm, rows = pll_case
  graphdef, params = nnx.split(lm.model, nnx.Param)
  packed_scorer = pll.Scorer(graphdef, lm.tokenizer, 32, rows=4)
  packed = packed_scorer.pack(rows)
  assert len(packed.input_ids) < sum(len(r) - 2 for r in rows) * 2 / 3   # copies share rows
  assert packed.real_tokens == sum(len(r) * (len(r) - 2) for r in rows)
  calls = []
  got = packed_scorer(params, rows, lambda done, total: calls.append((done, total)))
  steps = -(-len(packed.input_ids) // 4)   # one chunk: after each step, its share of rows as sentences
  assert calls == [(6 * min(4 * (b + 1), len(packed.input_ids)) // len(packed.input_ids), 6) for b in range(steps)]
  unpacked = pll.Scorer(graphdef, lm.tokenizer, 32, rows=4, one_per_row=True)(params, rows)
  np.testing.assert_allclose(got, unpacked, rtol=0, atol=1e-4)
  by_sentence = pll.Scorer(graphdef, lm.tokenizer, 32, rows=4, chunk_tokens=1)   # packed one sentence at a time
  np.testing.assert_allclose(by_sentence(params, rows), got, rtol=0, atol=1e-5)
  assert got[0] == pytest.approx(_direct_pll(lm, rows[0], [[i] for i in range(1, len(rows[0]) - 1)]), abs=1e-4)

  pytest.importorskip("transformers")
  import torch
  import transformers
  folders.to_hf(str(workdir), str(tmp_path / "hf"))
  hf = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf")).eval()
  for seq, ours in zip(rows, got):
    copies = torch.tensor([seq] * (len(seq) - 2))
    where = torch.arange(1, len(seq) - 1)
    copies[torch.arange(len(where)), where] = lm.tokenizer.mask_id
    with torch.no_grad():
      logp = torch.log_softmax(hf(input_ids=copies).logits.double(), -1)
    theirs = float(logp[torch.arange(len(where)), where, torch.tensor(seq)[where]].sum())
    assert ours == pytest.approx(theirs, abs=1e-4)


def _words(tok, seq) -> list:
  """The words of a sentence (lists of positions, BOS/EOS apart) from the tokenizer's pieces: a piece
  begins a word when its text starts with sentencepiece's word marker."""
  words = []
  for i in range(1, len(seq) - 1):
    if tok.id_to_piece(int(seq[i])).startswith("\u2581") or not words:
      words.append([])
    words[-1].append(i)
  return words


def _units(variant: str, words: list) -> list:
  """The direct computation's (masked, scored) per forward pass, written from the variants' definitions."""
  if variant == "token":
    return [([i], [i]) for w in words for i in w]
  if variant == "whole_word":
    return [(w, w) for w in words]
  return [(w[k:], [w[k]]) for w in words for k in range(len(w))]   # word_l2r: the piece and its word's rest


def test_a_gpt_bert_run_is_scored_and_exported_with_its_shift(pll_case, workdir, tmp_path):
  """objective=gpt_bert (the fixture's model under that objective): PLL reads a masked token at t from t - 1, as
  the objective says (the direct computation; not MLM's reading); to_hf writes prediction_shift=1, which our
  reader of the folder follows, and transformers' causal LM of the folder (is_decoder=True) gives our causal
  rows' logits: one set of weights, both uses."""
  import shutil

  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from mlm_jax.convert import folders
  from mlm_jax.evaluation import fill_mask, pll
  _, rows = pll_case
  run = tmp_path / "gpt_bert"
  shutil.copytree(workdir, run)
  config = json.loads((run / "config.json").read_text())
  (run / "config.json").write_text(json.dumps(dict(config, objective="gpt_bert")))
  lm = fill_mask.from_workdir(str(run))
  graphdef, params = nnx.split(lm.model, nnx.Param)
  got = pll.Scorer(graphdef, lm.tokenizer, 32, rows=4, shift=lm.shift)(params, rows[:2])
  assert lm.shift == 1
  tokens = [[i] for i in range(1, len(rows[1]) - 1)]
  assert got[1] == pytest.approx(_direct_pll(lm, rows[1], tokens, shift=1), abs=1e-4)
  assert abs(got[1] - _direct_pll(lm, rows[1], tokens)) > 1e-3

  pytest.importorskip("transformers")
  import torch
  import transformers
  folders.to_hf(str(run), str(tmp_path / "hf"))
  assert json.loads((tmp_path / "hf" / "config.json").read_text())[folders.SHIFT_KEY] == 1
  from_folder = fill_mask.from_hf_dir(str(tmp_path / "hf"))
  assert from_folder.shift == 1
  g2, p2 = nnx.split(from_folder.model, nnx.Param)
  np.testing.assert_allclose(pll.Scorer(g2, from_folder.tokenizer, 32, rows=4, shift=from_folder.shift)(p2, rows[:2]),
                             got, atol=1e-4)
  causal_lm = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), is_decoder=True).eval()
  seq = rows[3]
  ids = jnp.asarray([seq], jnp.int32)
  ours = lm.model.mlm_logits(lm.model(ids, jnp.ones_like(ids), jnp.arange(len(seq))[None], causal=jnp.ones(1, bool)))
  with torch.no_grad():
    theirs = causal_lm(input_ids=torch.tensor([seq])).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4)


@pytest.mark.parametrize("variant", ["token", "whole_word", "word_l2r"])
def test_each_pll_variant_equals_its_direct_computation(pll_case, variant):
  """token, whole_word and word_l2r (Kauf & Ivanova, 2023): packed rows (the fast path, sentences sharing
  rows) and one copy a row both equal one forward pass per masked copy, on real sentences of the fixture's
  model; on a sentence with a word of several pieces the three differ."""
  import numpy as np
  from flax import nnx
  from mlm_jax.evaluation import pll
  lm, rows = pll_case
  graphdef, params = nnx.split(lm.model, nnx.Param)
  words = [_words(lm.tokenizer, r) for r in rows]
  long_word = next(k for k, w in enumerate(words) if any(len(x) > 1 for x in w))   # a word of several pieces
  picked = [long_word, 0]
  scorer = pll.Scorer(graphdef, lm.tokenizer, 32, rows=4, variant=variant)
  packed = scorer(params, rows)
  copies = sum(len(_units(variant, w)) for w in words)
  assert len(scorer.pack(rows).input_ids) < copies * 2 / 3   # copies of several sentences share rows
  unpacked = pll.Scorer(graphdef, lm.tokenizer, 32, rows=4, variant=variant, one_per_row=True)(params, rows)
  np.testing.assert_allclose(packed, unpacked, rtol=0, atol=1e-4)
  for k in picked:
    assert packed[k] == pytest.approx(_direct_pll(lm, rows[k], _units(variant, words[k])), abs=1e-4), k
  others = [v for v in pll.VARIANTS if v != variant]
  for v in others:   # 2.5e-4 apart for this near-uniform random model; float error ~1e-6
    assert abs(packed[long_word] - _direct_pll(lm, rows[long_word], _units(v, words[long_word]))) > 2e-5, v


def test_errors_are_one_line(workdir, capsys):
  code, _, err = _run(capsys, f"--workdir={workdir}", f"--data={workdir}/nothing*.txt", "--seq_len=32")
  assert code == 2 and err.startswith("error: ") and "nothing*.txt" in err and len(err.strip().splitlines()) == 1
  code, _, err = _run(capsys, f"--workdir={workdir}", f"--data={workdir.parent}/held_out.txt", "--seq_len=512")
  assert code == 2 and "--seq_len=512" in err


def test_against_transformers_scores_the_same_masks(workdir, tmp_path, capsys):
  """--against_transformers: transformers' own loss on our corrupted batches equals ours (an exact import)."""
  pytest.importorskip("transformers")
  from mlm_jax.convert import folders
  folders.to_hf(str(workdir), str(tmp_path / "hf"))
  code, out, err = _run(capsys, f"--hf_dir={tmp_path / 'hf'}", f"--data={workdir.parent / 'held_out.txt'}",
                        "--seq_len=32", "--batch_size=8", "--max_lines=16", "--pll_lines=0", "--against_transformers")
  assert code == 0, err
  r = json.loads(out.strip().splitlines()[-1])
  assert r["num_predictions"] > 16 and r["loss_abs_diff"] < 1e-4, r
  code, _, err = _run(capsys, f"--workdir={workdir}", f"--data={workdir.parent / 'held_out.txt'}", "--seq_len=32",
                      "--against_transformers")
  assert code == 2 and "--against_transformers needs --hf_dir" in err
