"""Files written by round 2's code (tests/fixtures/round2, made at commit 68ac30c) still resume.

A user's workdir and token store outlive the code that wrote them. The fixture's checkpoint at step 2
resumes with today's code, reads its rows from the old store through the saved data state, and
reproduces the losses the old code logged for steps 3 and 4 and its eval loss at step 4.
"""
import json
import pathlib
import shutil
import subprocess
import sys

from subproc import REPO, cpu_env

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "round2"


def _metrics(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_round2_workdir_and_store_resume_with_the_same_losses(tmp_path):
  shutil.copytree(FIXTURE / "workdir", tmp_path / "workdir")
  shutil.copytree(FIXTURE / "store", tmp_path / "store")
  old = _metrics(tmp_path / "workdir")
  cmd = [sys.executable, "-m", "mlm_jax.train", f"--config={REPO / 'configs' / 'demo.py'}", "--workdir=workdir",
         "--config.demo_corpus=False", "--config.data.sources=('store:store',)", "--config.data.seq_len=32",
         "--config.model.hidden_size=16", "--config.model.num_layers=1", "--config.model.num_heads=2",
         "--config.model.intermediate_size=32", "--config.model.max_position_embeddings=34",
         "--config.train.batch_size=4", "--config.train.steps=4", "--config.train.save_every=2",
         "--config.train.log_every=1", "--config.train.eval_every=4", "--config.train.eval_batches=1",
         "--config.train.eval_at_start=False"]   # the command that wrote the fixture (its README)
  p = subprocess.run(cmd, cwd=tmp_path, env=dict(cpu_env(), PYTHONPATH=str(REPO)), capture_output=True,
                     text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-3000:]
  assert "resuming from step 2" in p.stderr, p.stderr[-3000:]
  new = _metrics(tmp_path / "workdir")
  assert [m["step"] for m in new if "loss" in m] == [1, 2, 3, 4]
  for key in ("loss", "eval_loss"):
    before = {m["step"]: m[key] for m in old if key in m}
    after = {m["step"]: m[key] for m in new if key in m}
    for step in (3, 4) if key == "loss" else (4,):
      assert abs(after[step] - before[step]) <= 1e-5, (key, step, after[step], before[step])
  assert (tmp_path / "workdir" / "checkpoints" / "4").is_dir()
