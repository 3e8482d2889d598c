"""Goodput (mlm_jax/workdir/goodput.py): a demo run killed with -9 and resumed accounts its wall time.

The killed run is one that cannot finish (100000 steps): it is killed once it has committed the
checkpoint of step 4 and logged step 6, wherever it then is. What the test checks does not depend
on where exactly that is: the steps it lost are read from its checkpoints and metrics.jsonl after
the kill, and the resumed run must report exactly those.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from subproc import REPO, cpu_env, kill_when

from test_train import _cmd, _losses, _steps


def _segments(workdir):
  return json.loads((workdir / "goodput.json").read_text())["segments"]


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory, corpus_and_tokenizer):
  wd = tmp_path_factory.mktemp("goodput") / "run"
  killed = subprocess.Popen(_cmd(wd, corpus_and_tokenizer, "--config.train.save_every=4", steps=100000), cwd=REPO,
                            env=cpu_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  kill_when(killed, lambda: 4 in _steps(wd) and (wd / "metrics.jsonl").exists() and max(_losses(wd), default=0) >= 6)
  assert killed.returncode == -signal.SIGKILL
  logged = _losses(wd)   # an uninterrupted run's losses, to the kill
  reached, resumed_from = max(logged), max(_steps(wd))   # as the kill left them
  before = _segments(wd)

  cmd = _cmd(wd, corpus_and_tokenizer, "--config.train.save_every=4", steps=reached + 3)
  t_spawn = time.time()
  p = subprocess.Popen(cmd, cwd=REPO, env=cpu_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  stderr, t_summary = [], None
  for line in p.stderr:   # the external clock: from spawning the process to its summary line
    stderr.append(line)
    if "] goodput " in line and t_summary is None:
      t_summary = time.time()
  assert p.wait(timeout=300) == 0, "".join(stderr)[-3000:]
  return dict(workdir=wd, reached=reached, resumed_from=resumed_from, before=before, logged=logged,
              stderr="".join(stderr), wall=t_summary - t_spawn if t_summary else None, t_spawn=t_spawn)


def test_lost_work_is_the_steps_between_the_last_checkpoint_and_the_kill(killed_and_resumed):
  r = killed_and_resumed
  killed, resumed = _segments(r["workdir"])
  assert [s["status"] for s in (killed, resumed)] == ["running", "finished"]   # the killed one never closed
  assert killed["start_time"] == r["before"][0]["start_time"] and resumed["start_step"] == r["resumed_from"]
  lost = resumed["lost"]
  assert lost["from_step"] == r["resumed_from"] and lost["to_step"] == r["reached"]
  assert lost["steps"] == r["reached"] - r["resumed_from"]
  assert lost["steps"] > 0, "killed right after a checkpoint: nothing to recompute (kill condition too late)"
  # Recomputed exactly: the streaming text path's iterator state, params and optimizer state restored after
  # kill -9 give the losses the killed run logged for the same steps.
  got = _losses(r["workdir"])
  for s in range(r["resumed_from"] + 1, r["reached"] + 1):
    assert abs(got[s] - r["logged"][s]) <= 1e-6, (s, got[s], r["logged"][s])
  # Recorded at every log line (a kill between writing metrics.jsonl and goodput.json: one step behind).
  assert r["reached"] - 1 <= killed["end_step"] <= r["reached"]
  # The seconds of the lost steps: what the killed run's own record says it spent after the checkpoint's
  # step (its step seconds at the end minus those at its mark for that step), not a guess from a mean.
  marks = {step: seconds for step, seconds in killed["marks"]}
  assert r["resumed_from"] in marks, (r["resumed_from"], killed["marks"])
  assert lost["seconds"] == pytest.approx(killed["seconds"]["step"] - marks[r["resumed_from"]], rel=1e-9)
  assert 0 < lost["seconds"] < killed["seconds"]["step"], (lost, killed["seconds"])


def test_the_parts_add_up_to_the_wall_time_and_the_summary_is_on_the_console(killed_and_resumed):
  r = killed_and_resumed
  _, resumed = _segments(r["workdir"])
  parts = sum(resumed["seconds"].values())
  assert parts == pytest.approx(resumed["wall_seconds"], rel=0.01)
  assert -0.05 <= resumed["start_time"] - r["t_spawn"] < 1.0   # the process's own start (10 ms ticks), not the loop's
  assert r["wall"] is not None, r["stderr"][-3000:]
  assert parts == pytest.approx(r["wall"], rel=0.05), (parts, r["wall"], resumed["seconds"])
  for k in ("startup", "compile", "step", "save", "restore", "eval"):
    assert resumed["seconds"][k] > 0, (k, resumed["seconds"])
  lines = [l for l in r["stderr"].splitlines() if "] goodput " in l]
  assert len(lines) == 1 and " in 2 runs: " in lines[0], r["stderr"][-3000:]
  assert f"({resumed['lost']['steps']} steps recomputed)" in lines[0]
  logged = [json.loads(l) for l in (r["workdir"] / "metrics.jsonl").read_text().splitlines() if '"loss"' in l]
  assert all(0 < l["goodput"] < 1 for l in logged), [l["goodput"] for l in logged]


def test_the_tool_prints_every_run_and_the_totals(killed_and_resumed):
  wd = killed_and_resumed["workdir"]
  p = subprocess.run([sys.executable, "tools/goodput.py", f"--workdir={wd}"], cwd=REPO, env=cpu_env(),
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == 0, p.stderr[-2000:]
  out = p.stdout.splitlines()
  assert out[0].startswith("run 0: ") and "killed or lost (no final record)" in out[0]
  assert out[1].startswith("run 1: ") and "finished" in out[1] and "recomputed" in out[1]
  assert any(l.strip().startswith("lost work") for l in out) and out[-1].startswith("goodput ")
  p = subprocess.run([sys.executable, "tools/goodput.py", f"--workdir={os.path.dirname(wd)}/none"], cwd=REPO,
                     env=cpu_env(), capture_output=True, text=True, timeout=120)
  assert p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1
