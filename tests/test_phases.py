"""A run in phases (config.phases), end to end through `python -m mlm_jax.train`: 3 phases where phase 2
doubles the sequence length (and RoPE theta) and phase 3 trains on another source with its own
learning-rate segment; kill -9 inside phase 2 and right after a boundary, then the same command: the
losses of the uninterrupted run, on the streaming text path and on token stores. Bad phases: one line.
"""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from subproc import REPO, cpu_env

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


def _kill_after(cmd, workdir, step: int) -> None:
  """Start `cmd` (a run far longer than `step`) and kill -9 it once metrics.jsonl has logged `step`."""
  proc = subprocess.Popen(cmd, cwd=REPO, env=cpu_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 400
  while time.time() < deadline and proc.poll() is None:
    if any(d.get("step", 0) >= step and "loss" in d for d in _lines(workdir)):
      proc.send_signal(signal.SIGKILL)
      break
    time.sleep(0.05)
  _, err = proc.communicate()
  assert proc.returncode == -signal.SIGKILL, err[-3000:]


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


@pytest.mark.parametrize("path", ["text", "store"])
def test_phases_resume_exactly_after_kill_9(sources, tmp_path, path):
  source, decay, spm = *sources[path], sources["spm"]
  straight, killed = tmp_path / "straight", tmp_path / "killed"
  p = _run(_cmd(straight, source, decay, spm, f"--config.train.stop_at_step={STOP}"))
  assert p.returncode == 0, p.stderr[-3000:]
  ref = _losses(straight)
  assert sorted(ref) == list(range(1, STOP + 1))
  assert [ref[s][1] for s in (4, 5, 8, 9)] == ["short", "long", "long", "decay"]
  assert "phase 2/3 'long': steps 4..8, global batch 8 x 64 tokens" in p.stderr
  assert "step 9/12 [decay]" in p.stderr
  recorded = json.load(open(straight / "config.json"))
  assert [dict(x)["end_step"] for x in recorded["phases"]] == [4, 8, 400] and recorded["data"]["seq_len"] == 64

  # kill -9 inside phase 2 (checkpoint 5 is phase 2's), then again right after the boundary at 8
  # (the newest checkpoint is still 5: the rerun replays phase 2's end and enters phase 3 again).
  _kill_after(_cmd(killed, source, decay, spm), killed, 6)
  _kill_after(_cmd(killed, source, decay, spm), killed, 9)
  p = _run(_cmd(killed, source, decay, spm, f"--config.train.stop_at_step={STOP}"))
  assert p.returncode == 0, p.stderr[-3000:]
  assert "resuming from step" in p.stderr
  got = _losses(killed)
  assert sorted(got) == list(range(1, STOP + 1))
  for s in range(1, STOP + 1):
    assert got[s][1] == ref[s][1] and abs(got[s][0] - ref[s][0]) <= 1e-6, (s, got[s], ref[s])


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
  assert [(p.start, p.end) for p in phases_lib.parse(config)] == [(0, 10), (10, 16)]


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
