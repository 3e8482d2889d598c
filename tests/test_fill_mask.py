"""After pretraining: export to transformers, fill-mask parity, and continued pretraining from HF.

The "demo pretraining" here is configs/demo.py shrunk so the suite stays fast: a 2-layer, 64-wide
model, 20 steps of 8 x 64 tokens on the session's demo corpus and 1000-piece tokenizer (conftest.py). It
runs on 4 fake CPU devices with a (data=2, tensor=2) mesh, so the checkpoint is sharded, and the export
runs in a separate process with one device - the "pod checkpoint on a laptop" case. The continued
pretraining from a transformers model runs the same command but for init_from, so it reuses the
compiled steps.
"""
import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from subproc import REPO, cpu_env

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SENTENCE = "Return a new <mask> containing the items of the list."


def _tool(name):
  spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


STEPS = 20


def _train_cmd(workdir, corpus, spm, *overrides, steps=STEPS):
  """The demo pretraining on a (data=2, tensor=2) mesh (run with devices=4)."""
  return [sys.executable, "-m", "mlm_jax.train", "--config=configs/demo.py", f"--workdir={workdir}",
          "--config.demo_corpus=False", f"--config.data.sources=('docs={corpus}',)",
          f"--config.data.tokenizer={spm}", "--config.data.seq_len=64", "--config.data.shuffle_buffer=100",
          "--config.model.hidden_size=64", "--config.model.num_layers=2", "--config.model.num_heads=2",
          "--config.model.intermediate_size=128", "--config.model.max_position_embeddings=66",
          "--config.train.batch_size=8", f"--config.train.steps={steps}", "--config.train.log_every=1",
          "--config.train.eval_every=1000", "--config.train.eval_batches=1",
          "--config.train.peak_tflops_per_device=0.1", "--config.optimizer.warmup_steps=5",
          "--config.optimizer.learning_rate=3e-3", "--config.mesh.data=2", "--config.mesh.tensor=2", *overrides]


def _run(cmd, devices=4, timeout=300):
  return subprocess.run(cmd, cwd=REPO, env=cpu_env(devices), capture_output=True, text=True, timeout=timeout)


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [r["loss"] for r in sorted(rows, key=lambda r: r["step"]) if "loss" in r]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, corpus_and_tokenizer):
  """(workdir, corpus, tokenizer) of a short demo pretraining on a 2x2 mesh of 4 devices."""
  from mlm_jax.data.tokenizers import load as tokenizer_load
  corpus, spm = corpus_and_tokenizer
  workdir = tmp_path_factory.mktemp("fill_mask") / "run"
  p = _run(_train_cmd(workdir, corpus, spm))
  assert p.returncode == 0, p.stderr[-3000:]
  assert "'data': 2" in p.stderr and "'tensor': 2" in p.stderr
  return workdir, corpus, tokenizer_load.load(spm)


def test_exported_folder_in_pipeline_matches_fill_mask(pretrained, tmp_path, capsys):
  workdir, _, tok = pretrained
  out = tmp_path / "hf"
  p = _run([sys.executable, "tools/convert_checkpoint.py", "to_hf", f"--workdir={workdir}", f"--out={out}"], devices=1)
  assert p.returncode == 0, p.stderr[-3000:]
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "spm.model"} <= set(os.listdir(out))
  assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in os.listdir(out))

  hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
  model = transformers.AutoModelForMaskedLM.from_pretrained(str(out))
  pipe = transformers.pipeline("fill-mask", model=model, tokenizer=hf_tok)
  theirs = pipe(SENTENCE, top_k=5)

  from mlm_jax.evaluation import fill_mask
  ids, _ = fill_mask.encode_with_masks(tok, SENTENCE)
  assert hf_tok(SENTENCE)["input_ids"] == ids

  tool = _tool("fill_mask")
  for source in (f"--workdir={workdir}", f"--hf_dir={out}"):
    capsys.readouterr()
    assert tool.main([source, SENTENCE, "--top_k=5", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    preds = ours["results"][0]["masks"][0]["predictions"]
    assert [p["id"] for p in preds] == [t["token"] for t in theirs], (source, preds, theirs)
    assert [p["token"] for p in preds] == [t["token_str"] for t in theirs]
    np.testing.assert_allclose([p["probability"] for p in preds], [t["score"] for t in theirs], atol=1e-4, rtol=0)

  # The table form names every prediction.
  assert tool.main([f"--workdir={workdir}", SENTENCE, "--top_k=3"]) == 0
  table = capsys.readouterr().out
  assert "mask 1" in table and all(str(t["token"]) in table for t in theirs[:3])


def test_from_hf_continues_pretraining(pretrained, tmp_path, capsys):
  """A random transformers XLM-R, imported with from_hf, trains with the binary (on the sharded mesh of the
  pretraining, whose compiled steps it reuses): finite, falling loss."""
  _, corpus, tok = pretrained
  torch.manual_seed(0)
  cfg = transformers.XLMRobertaConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, intermediate_size=128, max_position_embeddings=66,
                                      type_vocab_size=1, pad_token_id=tok.pad_id, bos_token_id=tok.bos_id,
                                      eos_token_id=tok.eos_id, layer_norm_eps=1e-5)
  transformers.XLMRobertaForMaskedLM(cfg).save_pretrained(str(tmp_path / "hf"))
  capsys.readouterr()
  code = _tool("convert_checkpoint").main(["from_hf", f"--hf_dir={tmp_path / 'hf'}", f"--out={tmp_path / 'ours'}",
                                           f"--tokenizer={tok.model_path}"])
  assert code == 0
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])

  run = tmp_path / "run"
  p = _run(_train_cmd(run, corpus, tok.model_path, *summary["train_flags"]))
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"initialized parameters from {tmp_path / 'ours'}" in p.stderr
  losses = _losses(run)
  assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.2, losses
