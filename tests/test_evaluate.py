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


def test_pll_matches_direct_computation(workdir):
  import jax
  import jax.numpy as jnp
  from mlm_jax.evaluation import fill_mask
  lm = fill_mask.from_workdir(str(workdir))
  rows = evaluate.sequences(lm.tokenizer, [str(workdir.parent / "held_out.txt")], 32, max_lines=1)
  got = evaluate.pseudo_log_likelihood(lm, rows, 32, batch_size=4)   # several batches, last one padded
  seq = rows[0]
  total = 0.0
  for i in range(1, len(seq) - 1):
    x = list(seq)
    x[i] = lm.tokenizer.mask_id
    ids = jnp.asarray([x], jnp.int32)
    hidden = lm.model(ids, jnp.ones_like(ids), jnp.arange(len(x))[None])
    total += float(jax.nn.log_softmax(lm.model.mlm_logits(hidden[0, i]))[seq[i]])
  assert got["pll_tokens"] == len(seq) - 2
  assert got["pll"] == pytest.approx(total, rel=1e-4)


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
