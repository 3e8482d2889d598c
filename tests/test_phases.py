"""A run in phases (config.phases), end to end through `python -m mlm_jax.train`: 3 phases where phase 2
doubles the sequence length (and RoPE theta) and phase 3 trains on another source with its own
learning-rate segment; kill -9 inside phase 2 and right after a boundary, then the same command: the
losses of the uninterrupted run, on the streaming text path and on token stores. Bad phases: one line.
"""
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from subproc import REPO, cpu_env, kill_when

def _demo_config(variant: str = "phases"):
  spec = importlib.util.spec_from_file_location("demo_config", REPO / "configs" / "demo.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


STOP = 12   # the compared steps: phases end at 4 and 8, and the decay phase is long (the kill cannot miss)


def _phases(decay_source: str) -> str:
  return ("({'name':'short','end_step':4},"
          "{'name':'long','end_step':8,'data.seq_len':64,'model.rope_theta':40000.0},"
          f"{{'name':'decay','end_step':400,'data.sources':({decay_source!r},),"
          "'optimizer.schedule':'linear','optimizer.warmup_steps':0,'optimizer.learning_rate':0.001})")


def _cmd(workdir, source: str, decay_source: str, spm: str, *more):
  return [sys.executable, "-m", "mlm_jax.train", "--config=configs/demo.py:phases", f"--workdir={workdir}",
          "--config.demo_corpus=False", f"--config.data.sources=({source!r},)", f"--config.data.tokenizer={spm}",
          "--config.data.shuffle_buffer=100", "--config.model.hidden_size=64", "--config.model.num_layers=2",
          "--config.model.num_heads=2", "--config.model.intermediate_size=128", "--config.train.batch_size=8",
          "--config.train.log_every=1", "--config.train.eval_every=1000", "--config.train.eval_batches=1",
          "--config.train.eval_at_start=False", "--config.train.save_every=5",
          "--config.train.peak_tflops_per_device=0.1", "--config.optimizer.warmup_steps=2",
          "--config.train.ema_decay=0.9",   # the moving average is saved and restored with the state
          f"--config.phases={_phases(decay_source)}", *more]


def _run(cmd, timeout=400):
  return subprocess.run(cmd, cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=timeout)


def _lines(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(l) for l in f if l.strip().endswith("}")]


def _losses(workdir):
  out = {}
  for d in _lines(workdir):
    if "loss" in d:
      assert d["step"] not in out, f"step {d['step']} logged twice"
      out[d["step"]] = (d["loss"], d["phase"])
  return out


def _kill_after(cmd, workdir, step: int, log) -> None:
  """Start `cmd` (a run far longer than `step`) and kill -9 it once metrics.jsonl has logged `step`."""
  with open(log, "w+") as err:   # a file, not a pipe: a full pipe would stall the run
    proc = subprocess.Popen(cmd, cwd=REPO, env=cpu_env(), stdout=subprocess.DEVNULL, stderr=err)
    kill_when(proc, lambda: any(d.get("step", 0) >= step and "loss" in d for d in _lines(workdir)))
    err.seek(0)
    assert proc.returncode == -signal.SIGKILL, err.read()[-3000:]


@pytest.fixture(scope="module")
def sources(corpus_and_tokenizer, tmp_path_factory):
  """{path: (source, decay source)} for 'text' (the demo corpus, then its second half) and 'store'
  (both prepared into token stores), and the tokenizer."""
  from mlm_jax.data.store import prepare
  corpus, spm = corpus_and_tokenizer
  root = tmp_path_factory.mktemp("phases")
  with open(corpus, encoding="utf-8") as f:
    lines = f.read().splitlines()
  half = root / "second_half.txt"
  half.write_text("\n".join(lines[len(lines) // 2:]) + "\n", encoding="utf-8")
  stores = {}
  for name, path in (("docs", corpus), ("half", str(half))):
    stores[name] = str(root / f"store_{name}")
    prepare.prepare(prepare.Options(sources=(f"{name}={path}",), tokenizer=spm, eval_percent=5.0), stores[name],
                    progress_s=1e9, log=lambda s: None)
  return dict(text=(f"docs={corpus}", f"half={half}"), store=(f"store:{stores['docs']}", f"store:{stores['half']}"),
              spm=spm)


def _straight(sources, path, workdir):
  """The uninterrupted run to STOP (checkpoints 5, 10 and 12)."""
  source, decay, spm = *sources[path], sources["spm"]
  p = _run(_cmd(workdir, source, decay, spm, f"--config.train.stop_at_step={STOP}"))
  assert p.returncode == 0, p.stderr[-3000:]
  ref = _losses(workdir)
  assert sorted(ref) == list(range(1, STOP + 1))
  assert [ref[s][1] for s in (4, 5, 8, 9)] == ["short", "long", "long", "decay"]
  assert "phase 2/3 'long': steps 4..8, global batch 8 x 64 tokens" in p.stderr
  assert "step 9/12 [decay]" in p.stderr
  recorded = json.load(open(workdir / "config.json"))
  assert [dict(x)["end_step"] for x in recorded["phases"]] == [4, 8, 400] and recorded["data"]["seq_len"] == 64
  return workdir


@pytest.fixture(scope="module")
def text_run(sources, tmp_path_factory):
  """The uninterrupted text-path run: the reference of the kill, branch and merge tests."""
  return _straight(sources, "text", tmp_path_factory.mktemp("phases_text") / "straight")


@pytest.mark.parametrize("path", ["text", "store"])
def test_phases_resume_exactly_after_kill_9(sources, tmp_path, path, request):
  source, decay, spm = *sources[path], sources["spm"]
  straight = request.getfixturevalue("text_run") if path == "text" else _straight(sources, path, tmp_path / "straight")
  killed = tmp_path / "killed"
  ref = _losses(straight)

  # kill -9 inside phase 2 (checkpoint 5 is phase 2's), then again right after the boundary at 8
  # (the newest checkpoint is still 5: the rerun replays phase 2's end and enters phase 3 again).
  _kill_after(_cmd(killed, source, decay, spm), killed, 6, tmp_path / "killed6.log")
  _kill_after(_cmd(killed, source, decay, spm), killed, 9, tmp_path / "killed9.log")
  p = _run(_cmd(killed, source, decay, spm, f"--config.train.stop_at_step={STOP}"))
  assert p.returncode == 0, p.stderr[-3000:]
  assert "resuming from step" in p.stderr
  got = _losses(killed)
  assert sorted(got) == list(range(1, STOP + 1))
  for s in range(1, STOP + 1):
    assert got[s][1] == ref[s][1] and abs(got[s][0] - ref[s][0]) <= 1e-6, (s, got[s], ref[s])
  # the EMA's held-out loss at the end: restored with the state, it is the uninterrupted run's
  ema = [[d for d in _lines(w) if "eval_ema_loss" in d and d["step"] == STOP][0] for w in (straight, killed)]
  assert ema[0]["eval_ema_loss"] != ema[0]["eval_loss"]
  assert abs(ema[1]["eval_ema_loss"] - ema[0]["eval_ema_loss"]) <= 1e-6, ema


BAD = [
    ("({'name':'a','end_step':8},{'name':'b','end_step':8})", "phases[1] 'b': ends at step 8, not after its start 8"),
    ("({'name':'a','end_step':8,'data.seq_lenn':64},)", "phases[0] 'a': unknown field 'data.seq_lenn'"),
    ("({'name':'a','end_step':8,'model.hidden_size':128},)", "phases[0] 'a': model.hidden_size cannot change mid-run"),
    ("({'name':'a'},)", "phases[0] 'a': give exactly one of end_step, end_tokens"),
]


@pytest.mark.parametrize("phases,message", BAD, ids=["not_increasing", "unknown", "immutable", "no_end"])
def test_bad_phases_are_one_line_errors(phases, message):
  from mlm_jax.config import phases as phases_lib
  from mlm_jax.errors import ConfigError
  config = _demo_config()
  config.phases = eval(phases, {})
  with pytest.raises(ConfigError) as e:
    phases_lib.parse(config)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_phase_ends_in_tokens_follow_each_phase_batch():
  from mlm_jax.config import phases as phases_lib
  config = _demo_config()
  config.phases = ({"name": "a", "end_tokens": 32 * 32 * 10},                      # 10 steps of 32 x 32
                   {"name": "b", "end_tokens": 32 * 32 * 10 + 16 * 64 * 5 + 1,     # 5 steps of 16 x 64, and one more
                    "data.seq_len": 64, "train.batch_size": 16})
  parsed = phases_lib.parse(config)
  assert [(p.start, p.end) for p in parsed] == [(0, 10), (10, 16)]
  # a warmup and a WSD decay given in tokens land on the steps that train them
  config.optimizer.update(dict(schedule="wsd", warmup_tokens=32 * 32 * 10 + 16 * 64 * 2, decay_tokens=16 * 64 * 4))
  phases_lib.bind_token_lengths(config, parsed)
  assert config.optimizer.warmup_steps == 12 and config.optimizer.decay_fraction == pytest.approx(4 / 16)


def test_a_refused_phased_run_changes_nothing(tmp_path, corpus_and_tokenizer):
  """The binary's one line, and the workdir exactly as it was."""
  corpus, spm = corpus_and_tokenizer
  wd = tmp_path / "run"
  wd.mkdir()
  (wd / "keep.txt").write_text("x")
  bad = "({'name':'a','end_step':8,'model.hidden_size':128},)"
  p = _run([sys.executable, "-m", "mlm_jax.train", "--config=configs/demo.py:phases", f"--workdir={wd}",
            "--config.demo_corpus=False", f"--config.data.sources=('docs={corpus}',)",
            f"--config.data.tokenizer={spm}", f"--config.phases={bad}"])
  assert p.returncode == 1
  errors = [l for l in p.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and "model.hidden_size cannot change mid-run" in errors[0], p.stderr[-2000:]
  assert sorted(os.listdir(wd)) == ["keep.txt"]


def _tree(workdir):
  return {os.path.relpath(os.path.join(d, f), workdir): os.stat(os.path.join(d, f)).st_mtime_ns
          for d, _, fs in os.walk(workdir) for f in fs}


def test_branch_continues_exactly_and_a_decay_branch_trains(sources, text_run, tmp_path):
  """A branch from step 5 with no overrides gives the source's losses after 5; a branch from step 10
  that ends the decay phase at 14 decays there; a step without a checkpoint is one line; the source
  is never written."""
  source, decay, spm = *sources["text"], sources["spm"]
  before = _tree(text_run)
  same = tmp_path / "same"
  p = _run(_cmd(same, source, decay, spm, f"--config.branch_from={text_run}:5", f"--config.train.stop_at_step={STOP}"))
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"branching from {text_run}:5" in p.stderr
  ref, got = _losses(text_run), _losses(same)
  assert sorted(got) == list(range(6, STOP + 1))
  for s in got:
    assert got[s][1] == ref[s][1] and abs(got[s][0] - ref[s][0]) <= 1e-6, (s, got[s], ref[s])

  short = _cmd(tmp_path / "decay", source, decay, spm, f"--config.branch_from={text_run}:10")
  short = [a.replace("'end_step':400", "'end_step':14") for a in short]
  p = _run(short)
  assert p.returncode == 0, p.stderr[-3000:]
  lines = [d for d in _lines(tmp_path / "decay") if "loss" in d]
  assert [d["step"] for d in lines] == [11, 12, 13, 14]
  assert lines[-1]["learning_rate"] < 0.25 * 1e-3 and all(0 < d["loss"] < 7.5 for d in lines)

  missing = tmp_path / "missing"
  p = _run(_cmd(missing, source, decay, spm, f"--config.branch_from={text_run}:7"))
  assert p.returncode == 1
  errors = [l for l in p.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and "no checkpoint for step 7" in errors[0] and "have 5, 10, 12" in errors[0], p.stderr[-2000:]
  assert not os.path.exists(missing / "checkpoints")
  assert _tree(text_run) == before


def test_merge_is_the_mean_and_exports_to_transformers(text_run, tmp_path):
  import numpy as np
  import jax
  from mlm_jax.workdir import files, merge
  out = tmp_path / "merged"
  p = _run([sys.executable, "tools/merge_checkpoints.py", f"--workdir={text_run}", "--steps=10,12", f"--out={out}"])
  assert p.returncode == 0, p.stderr[-3000:]
  config = files.read_config(str(text_run))
  a, b, m = (merge._params(str(w), config, s) for w, s in ((text_run, 10), (text_run, 12), (out, 12)))
  for x, y, z in zip(jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(m)):
    np.testing.assert_allclose(np.asarray(z), (np.asarray(x, np.float64) + np.asarray(y, np.float64)) / 2, rtol=1e-6)
  hf = tmp_path / "hf"
  p = _run([sys.executable, "tools/convert_checkpoint.py", "to_hf", f"--workdir={out}", f"--out={hf}"])
  assert p.returncode == 0, p.stderr[-3000:]
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  model = transformers.AutoModelForMaskedLM.from_pretrained(str(hf))
  assert type(model).__name__ == "ModernBertForMaskedLM"
  with torch.no_grad():
    logits = model(input_ids=torch.tensor([[0, 10, 20, 30, 2]])).logits
  assert torch.isfinite(logits).all()
  # the EMA exports too, and is not the parameters
  ema_hf = tmp_path / "ema_hf"
  p = _run([sys.executable, "tools/convert_checkpoint.py", "to_hf", f"--workdir={text_run}", "--ema", f"--out={ema_hf}"])
  assert p.returncode == 0, p.stderr[-3000:]
  ema_model = transformers.AutoModelForMaskedLM.from_pretrained(str(ema_hf))
  with torch.no_grad():
    ema_logits = ema_model(input_ids=torch.tensor([[0, 10, 20, 30, 2]])).logits
  assert torch.isfinite(ema_logits).all() and not torch.allclose(ema_logits, logits)

  other = tmp_path / "other"
  shutil.copytree(text_run, other)
  raw = json.load(open(other / "config.json"))
  raw["model"]["num_heads"] = 4
  json.dump(raw, open(other / "config.json", "w"))
  p = _run([sys.executable, "tools/merge_checkpoints.py", f"{text_run}:12", f"{other}:12", f"--out={tmp_path / 'bad'}"])
  assert p.returncode == 2
  assert "model.num_heads=4 vs 2" in p.stderr.strip().splitlines()[-1], p.stderr[-2000:]
  assert not os.path.exists(tmp_path / "bad")
