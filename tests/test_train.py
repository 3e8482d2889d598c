"""The training binary end to end, as a user runs it: subprocesses of `python -m mlm_jax.train`.

Runs use the demo config shrunk to a 2-layer, 64-wide model on the demo corpus (Python's docs),
with one tokenizer trained once per session, so each run takes seconds.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from subproc import REPO, cpu_env, kill_when

from mlm_jax.workdir import restore



def _cmd(workdir, data, *overrides, steps=12):
  corpus, spm = data
  base = [sys.executable, "-m", "mlm_jax.train", "--config=configs/demo.py", f"--workdir={workdir}",
          "--config.demo_corpus=False", f"--config.data.sources=('docs={corpus}',)",
          f"--config.data.tokenizer={spm}", "--config.data.seq_len=64", "--config.data.shuffle_buffer=100",
          "--config.model.hidden_size=64", "--config.model.num_layers=2", "--config.model.num_heads=2",
          "--config.model.intermediate_size=128", "--config.model.max_position_embeddings=66",
          "--config.train.batch_size=8", f"--config.train.steps={steps}", "--config.train.log_every=1",
          "--config.train.eval_every=1000", "--config.train.eval_batches=2",
          "--config.train.peak_tflops_per_device=0.1", "--config.optimizer.warmup_steps=2",
          # A schedule that does not depend on train.steps keeps the train step's program the same
          # across runs of different lengths, so the session's compilation cache serves them.
          "--config.optimizer.schedule=constant"]
  return base + list(overrides)


# The length of a run that a test kills: it cannot end before the kill lands, however fast the host.
RUNS_ON = 100000


def _run(cmd, timeout=300):
  return subprocess.run(cmd, cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=timeout)


def _losses(workdir):
  out = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      d = json.loads(line)
      if "loss" in d:
        assert d["step"] not in out, f"step {d['step']} logged twice"
        out[d["step"]] = d["loss"]
  return out


def _steps(workdir):
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(x) for x in os.listdir(d) if x.isdigit()) if os.path.isdir(d) else []


def _error_line(proc):
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error: ")]
  assert len(lines) == 1, proc.stderr[-3000:]
  return lines[0]


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory, corpus_and_tokenizer):
  """A workdir holding a finished 2-step run (checkpoint 2); tests take copies of it."""
  wd = tmp_path_factory.mktemp("two_step") / "run"
  p = _run(_cmd(wd, corpus_and_tokenizer, "--config.train.save_every=2", steps=2))
  assert p.returncode == 0, p.stderr[-3000:]
  assert _steps(wd) == [2]
  return wd


def _copy_of(run, tmp_path):
  wd = tmp_path / "run"
  shutil.copytree(run, wd)
  return wd


# ELECTRA on the same model: 32-wide shared embeddings, a 16-wide generator (1/4), positions from 0
# as transformers' ELECTRA numbers them.
ELECTRA = ("--config.objective=electra", "--config.model.embedding_size=32", "--config.model.position_offset=0",
           "--config.model.max_position_embeddings=64")


@pytest.fixture(scope="module")
def electra_run(tmp_path_factory, corpus_and_tokenizer, shared_data):
  """A finished 12-step ELECTRA run (checkpoints 6 and 12): the kill -9 test's reference, and exported.
  It also probes its discriminator every 6 steps and scores its generator on 1 BLiMP pair of each paradigm
  (probes read parameters only: the losses are the same)."""
  wd = tmp_path_factory.mktemp("electra") / "run"
  p = _run(_cmd(wd, corpus_and_tokenizer, *ELECTRA, "--config.train.save_every=6", "--config.train.probe_every=6",
                "--config.train.probe_tasks=('sms_spam','pos','blimp')", "--config.train.probe_train_examples=64",
                "--config.train.probe_eval_examples=32", "--config.train.probe_blimp_pairs=1", steps=12))
  assert p.returncode == 0, p.stderr[-3000:]
  return wd


@pytest.fixture(scope="module")
def docs_store(corpus_and_tokenizer, tmp_path_factory):
  """The demo corpus prepared into a token store with the session's tokenizer."""
  from mlm_jax.data.store import prepare
  corpus, spm = corpus_and_tokenizer
  root = str(tmp_path_factory.mktemp("kill_store") / "store")
  prepare.prepare(prepare.Options(sources=(f"docs={corpus}",), tokenizer=spm, eval_percent=5.0), root,
                  progress_s=1e9, log=lambda s: None)
  return root


def _store_workers(parent: int) -> list:
  """Pids of the store batch workers (python -m mlm_jax.data.store.batch) that `parent` started.
  Only this trainer's: a worker of another test's pipeline in this pytest process is not its business."""
  out = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read()
      with open(f"/proc/{pid}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      continue
    if b"mlm_jax.data.store.batch" in cmdline and ppid == parent:
      out.append(int(pid))
  return out


def _alive(pids) -> list:
  """The pids that still run (a zombie has ended; init reaps a killed trainer's orphans)."""
  out = []
  for pid in pids:
    try:
      with open(f"/proc/{pid}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[0] != "Z":
          out.append(pid)
    except OSError:
      pass
  return out


@pytest.mark.parametrize("objective", ["electra", "store"])
def test_exact_resume_after_kill_9(tmp_path, corpus_and_tokenizer, request, objective):
  """kill -9 mid-run, then the same command: the losses of an uninterrupted run. 'electra': ELECTRA on
  the streaming text path (tf.data, the iterator's state in the checkpoint). 'store': MLM from a token
  store whose batches 2 worker processes build; they end with the killed trainer. Between them both
  input paths and both kinds of objective state (one model; two towers) are killed and resumed."""
  n = 6
  extra = ELECTRA if objective == "electra" else ("--config.data.store_workers=2",)

  def cmd(workdir, *more):
    out = _cmd(workdir, corpus_and_tokenizer, *extra, *more, steps=2 * n)
    if objective == "store":   # a tuple flag given twice is appended to: replace the text source
      store = request.getfixturevalue("docs_store")
      out = [f"--config.data.sources=('store:{store}',)" if a.startswith("--config.data.sources=") else a
             for a in out]
    return out

  reference = None
  if objective == "electra":
    straight = request.getfixturevalue("electra_run")
  else:   # the uninterrupted run, beside the one to be killed
    straight = tmp_path / "straight"
    reference = subprocess.Popen(cmd(straight, f"--config.train.save_every={n}"), cwd=REPO, env=cpu_env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

  # The same command but for its length: a run that cannot end by itself (RUNS_ON steps) is killed with
  # -9 once checkpoint n is committed and step n + 1 is logged, wherever it then is; the rerun (2n steps)
  # resumes from its newest checkpoint. Evaluating every step slows the steps down, so the kill lands
  # long before checkpoint 2n (asserted: the comparison needs steps past the checkpoint resumed from).
  killed = tmp_path / "killed"
  resume_cmd = cmd(killed, f"--config.train.save_every={n}")
  killed_cmd = resume_cmd + [f"--config.train.steps={RUNS_ON}", "--config.train.eval_every=1",
                             "--config.train.eval_batches=8"]
  log = open(tmp_path / "killed.log", "w+")   # a file, not a pipe: a full pipe would stall the run
  proc = subprocess.Popen(killed_cmd, cwd=REPO, env=cpu_env(), stdout=subprocess.DEVNULL, stderr=log)
  workers = []

  def ready():   # checkpoint n committed and step n + 1 logged; the store's workers seen just before
    if n in _steps(killed) and os.path.exists(killed / "metrics.jsonl") and max(_losses(killed), default=0) > n:
      workers.extend(_store_workers(proc.pid))
      return True
    return False

  kill_when(proc, ready)
  log.seek(0)
  assert proc.returncode == -signal.SIGKILL, log.read()[-3000:]
  assert max(_steps(killed)) < 2 * n, _steps(killed)
  assert len(workers) == (2 if objective == "store" else 0)
  deadline = time.time() + 20
  while _alive(workers) and time.time() < deadline:   # a worker ends when its stdin closes
    time.sleep(0.1)
  assert not _alive(workers)
  if reference is not None:
    _, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err[-3000:]
  ref = _losses(straight)
  assert sorted(ref) == list(range(1, 2 * n + 1))

  resumed_from = max(_steps(killed))
  p = _run(resume_cmd)
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"resuming from step {resumed_from}" in p.stderr
  assert f"pid {proc.pid}," in p.stderr and "its process is gone" in p.stderr   # the killed run's lock
  got = _losses(killed)
  assert sorted(got) == list(range(1, 2 * n + 1))
  for s in range(resumed_from + 1, 2 * n + 1):
    assert abs(got[s] - ref[s]) <= 1e-6, (s, got[s], ref[s])
  # padding is not work: the log counts real tokens (best-fit packing: nearly every slot)
  last = [json.loads(l) for l in open(killed / "metrics.jsonl") if '"loss"' in l][-1]
  assert 0.9 < last["real_fraction"] <= 1.0, last
  assert last["real_tokens_per_sec"] == pytest.approx(last["real_fraction"] * last["tokens_per_sec"], rel=1e-3)
  assert "tok/s (real " in p.stderr


def test_electra_run_exports_both_towers_and_init_from_takes_the_discriminator(electra_run, tmp_path):
  """to_hf of a trained ELECTRA run: transformers' two models give our logits (1e-4); fill_mask takes
  the generator and refuses the discriminator; fine-tuning's init_from restores the discriminator."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import jax
  import numpy as np
  from flax import nnx
  from mlm_jax.workdir import checkpoints, files as workdir_files
  from mlm_jax.evaluation import fill_mask
  from mlm_jax.model import tree_paths
  from mlm_jax.model.encoder import abstract_model
  from mlm_jax.objectives import electra_model
  from mlm_jax.convert import folders
  from mlm_jax.convert import electra_towers
  from mlm_jax.errors import UserError

  lines = [json.loads(line) for line in (electra_run / "metrics.jsonl").read_text().splitlines()]
  probes = {m["step"]: m for m in lines if "probe/token_cosine" in m}
  assert sorted(probes) == [0, 6, 12]   # the demo config evaluates (and probes) before step 1 too
  assert all(0 <= m[f"probe/{t}"] <= 1 for m in probes.values() for t in ("sms_spam", "pos", "blimp")), probes
  assert all(m["probe/blimp_seconds"] > 0 for m in probes.values())
  final = [m for m in lines if "eval_disc_auc" in m][-1]
  assert final["step"] == 12 and all(0 <= final[f"eval_{k}"] <= 1 for k in ("disc_auc", "disc_precision",
                                                                              "disc_recall", "sampled_accuracy"))

  out = tmp_path / "hf"
  summary = folders.to_hf(str(electra_run), str(out))
  assert summary["step"] == 12 and "generator/model.safetensors" in summary["files"]
  config, params, _ = electra_towers.restore_pair(str(electra_run))
  pair = nnx.merge(electra_model.abstract_pair(config)[0], params)
  tok = workdir_files.load_tokenizer(workdir_files.tokenizer_path(str(electra_run), config))
  ids = [tok.bos_id] + tok.encode("The list is returned, and the <mask> is sorted in place.") + [tok.eos_id]
  x = np.asarray([ids], np.int32)
  args = (x, np.ones_like(x), np.arange(x.shape[1], dtype=np.int32)[None])
  disc = transformers.ElectraForPreTraining.from_pretrained(out / "discriminator").eval()
  gen = transformers.AutoModelForMaskedLM.from_pretrained(out / "generator").eval()
  assert type(gen).__name__ == "ElectraForMaskedLM"
  with torch.no_grad():
    theirs_d = disc(input_ids=torch.from_numpy(x).long()).logits.numpy()
    theirs_g = gen(input_ids=torch.from_numpy(x).long()).logits.numpy()
  ours_d = np.asarray(pair.rtd_head(pair.discriminator(*args), pair.discriminator.dtype))
  ours_g = np.asarray(pair.generator.mlm_logits(pair.generator(*args)))
  np.testing.assert_allclose(ours_d, theirs_d, atol=1e-4, rtol=1e-4)
  np.testing.assert_allclose(ours_g, theirs_g, atol=1e-4, rtol=1e-4)

  lm = fill_mask.load(hf_dir=str(out / "generator"))
  assert fill_mask.fill_mask(lm, "the <mask> is sorted", top_k=3)["masks"][0]["predictions"]
  with pytest.raises(UserError, match="ELECTRA discriminator.*no MLM head"):
    fill_mask.load(hf_dir=str(out / "discriminator"))

  # What `mlm_jax.finetune --init_from=RUN` restores: the discriminator, nothing of the generator.
  ft_cfg = workdir_files.read_config(str(electra_run)).model
  ft_cfg.mlm_head = False
  abstract = checkpoints.single_device(abstract_model(ft_cfg)[1])
  restored = restore.restore_params_for(str(electra_run), ft_cfg, abstract)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(restored), jax.tree.leaves(params["discriminator"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=tree_paths.path_name(path))


def test_sigterm_saves_current_step_and_rerun_continues(tmp_path, corpus_and_tokenizer):
  wd = tmp_path / "run"
  cmd = _cmd(wd, corpus_and_tokenizer, "--config.train.save_every=1000", "--config.train.eval_every=1",
             "--config.train.eval_batches=8", steps=RUNS_ON)   # it cannot end before the signal lands
  proc = subprocess.Popen(cmd, cwd=REPO, env=cpu_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 600   # a hang guard only: a loaded host is slow
    while time.time() < deadline and proc.poll() is None:
      if os.path.exists(wd / "metrics.jsonl") and max(_losses(wd), default=0) >= 3:
        proc.send_signal(signal.SIGTERM)
        break
      time.sleep(0.05)
    _, err = proc.communicate(timeout=240)
  finally:
    proc.kill()
  assert proc.returncode == 0, err[-3000:]
  last_logged = max(_losses(wd))
  assert _steps(wd) == [last_logged] and last_logged < RUNS_ON

  p = _run(cmd[:-1] + [f"--config.train.steps={last_logged + 2}"])
  assert p.returncode == 0, p.stderr[-3000:]
  assert sorted(_losses(wd)) == list(range(1, last_logged + 3))
  assert "resuming from step %d" % last_logged in p.stderr


def test_kill_during_async_save_leaves_previous_checkpoint(tmp_path, corpus_and_tokenizer):
  wd = tmp_path / "run"
  # A wider model makes each save take long enough to be caught in the middle.
  big = ["--config.model.hidden_size=256", "--config.model.intermediate_size=1024", "--config.model.num_heads=4"]
  ckpt_dir = wd / "checkpoints"
  caught = False
  # A run that saves every step and cannot end by itself: watched until a save is caught in progress.
  proc = subprocess.Popen(_cmd(wd, corpus_and_tokenizer, "--config.train.save_every=1", *big, steps=RUNS_ON),
                          cwd=REPO, env=cpu_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 600   # a hang guard only: a loaded host is slow
    while time.time() < deadline and proc.poll() is None:
      # once a checkpoint is committed, the next save in progress is the one to catch
      if _steps(wd) and any("tmp" in x for x in os.listdir(ckpt_dir)):
        proc.send_signal(signal.SIGKILL)
        caught = True
        break
      time.sleep(0.001)   # a save lasts far longer; without the pause this loop takes a core from the run
  finally:
    proc.kill()
    proc.wait()
  assert caught, "no save was in progress at any moment we looked"
  committed = _steps(wd)
  assert committed and committed[0] >= 1
  # Every committed checkpoint restores: the rerun resumes from the newest one.
  p = _run(_cmd(wd, corpus_and_tokenizer, "--config.train.save_every=100", *big, steps=committed[-1] + 1))
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"resuming from step {committed[-1]}" in p.stderr


def test_config_typo_is_one_line_and_names_the_key(tmp_path, corpus_and_tokenizer):
  p = _run(_cmd(tmp_path / "run", corpus_and_tokenizer, "--config.trian.steps=5"))
  assert p.returncode != 0
  assert "trian" in p.stderr.strip().splitlines()[-1], p.stderr[-2000:]
  assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("field", ["sources", "eval_sources"])
def test_missing_corpus_is_one_line(tmp_path, corpus_and_tokenizer, field):
  """Also a missing held-out corpus, which fails at start rather than at the first evaluation."""
  p = _run(_cmd(tmp_path / "run", corpus_and_tokenizer, f"--config.data.{field}=('docs=/nonexistent/*.txt',)"))
  assert p.returncode == 1
  assert "/nonexistent/*.txt" in _error_line(p)
  assert not (tmp_path / "run" / "checkpoints").exists() and "step 1/" not in p.stderr


def test_checkpoint_of_another_shape_is_refused_and_kept(tmp_path, corpus_and_tokenizer, two_step_run):
  wd = _copy_of(two_step_run, tmp_path)
  before = sorted(str(x.relative_to(wd)) for x in (wd / "checkpoints").rglob("*"))
  config_before = (wd / "config.json").read_text()
  p = _run(_cmd(wd, corpus_and_tokenizer, "--config.model.intermediate_size=96", steps=4))
  assert p.returncode == 1
  line = _error_line(p)
  # The first parameter that differs (in tree order) is named with both shapes.
  assert "layers.0.mlp.wi_" in line and "128" in line and "96" in line and "another model shape" in line, line
  assert sorted(str(x.relative_to(wd)) for x in (wd / "checkpoints").rglob("*")) == before
  assert (wd / "config.json").read_text() == config_before


@pytest.mark.parametrize("mode", ["skip", "stop"])
def test_nonfinite_guard(tmp_path, corpus_and_tokenizer, two_step_run, mode):
  wd = _copy_of(two_step_run, tmp_path)
  # An absurd learning rate: the first update blows the weights up, every later loss is NaN.
  p = _run(_cmd(wd, corpus_and_tokenizer, "--config.optimizer.learning_rate=1e30",
                "--config.optimizer.warmup_steps=0", "--config.train.save_every=1",
                f"--config.train.nonfinite={mode}", "--config.train.max_consecutive_nonfinite=3", steps=30))
  assert p.returncode == 1
  line = _error_line(p)
  assert ("non-finite" in line or "not finite" in line) and "checkpoint is intact" in line, line
  logged = [json.loads(l) for l in open(wd / "metrics.jsonl")]
  skipped = sum(d.get("skipped_nonfinite", 0) for d in logged)
  assert skipped >= (3 if mode == "skip" else 1)
  # Steps whose loss was not finite were never saved.
  import math
  bad = {d["step"] for d in logged if "loss" in d and not math.isfinite(d["loss"])}
  assert bad and not bad & set(_steps(wd))


def _truncate_largest_file(folder):
  biggest = max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  with open(biggest, "r+b") as f:
    f.truncate(biggest.stat().st_size // 2)


def test_a_moved_run_resumes_past_a_truncated_newest_checkpoint(electra_run, corpus_and_tokenizer, tmp_path):
  """The ELECTRA run and its corpus copied to another disk, the newest checkpoint (12) truncated on the
  way: the rerun warns, sets 12 aside as 12.corrupt (kept), resumes from 6 and logs the losses of the
  uninterrupted run; the data fingerprint holds no path, so the moved corpus is the same data."""
  corpus, spm = corpus_and_tokenizer
  disk = tmp_path / "other_disk"
  wd = disk / "run"
  shutil.copytree(electra_run, wd)
  moved = disk / "corpus" / os.path.basename(corpus)
  moved.parent.mkdir()
  shutil.copy(corpus, moved)
  _truncate_largest_file(wd / "checkpoints" / "12")
  p = _run(_cmd(wd, (str(moved), spm), *ELECTRA, "--config.train.save_every=6", steps=12))
  assert p.returncode == 0, p.stderr[-3000:]
  assert "skipped checkpoint 12" in p.stderr and "12.corrupt" in p.stderr, p.stderr[-3000:]
  assert "resuming from step 6" in p.stderr
  assert (wd / "checkpoints" / "12.corrupt").is_dir() and _steps(wd) == [6, 12]
  ref, got = _losses(electra_run), _losses(wd)
  assert sorted(got) == list(range(1, 13))
  for s in range(7, 13):
    assert abs(got[s] - ref[s]) <= 1e-6, (s, got[s], ref[s])
  assert not (wd / "lock.json").exists()   # released at exit


FILE_LIMIT = 100_000   # bytes: below a checkpoint's data files (~150-400 kB), above every other file a run writes


def _small_files():
  """In the child: files may not grow past FILE_LIMIT (EFBIG, as a full disk gives ENOSPC), and the
  signal that limit sends is ignored, so the write fails instead of killing the process."""
  import resource
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def test_a_failed_save_stops_the_run_in_one_line_and_a_copy_resumes(tmp_path, corpus_and_tokenizer, two_step_run):
  """A save that cannot be written (a file-size limit stands in for a full disk: both fail the write
  inside orbax's background threads) stops the run at that step: exit 1, one error line naming the
  checkpoint, no traceback; checkpoint 2 intact, the partial folder removed. The workdir copied to
  another disk (no limit there) resumes."""
  wd = _copy_of(two_step_run, tmp_path)
  cmd = lambda workdir: _cmd(workdir, corpus_and_tokenizer, "--config.train.save_every=2", steps=6)
  p = subprocess.run(cmd(wd), cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=300,
                     preexec_fn=_small_files)
  assert p.returncode == 1, p.stderr[-3000:]
  line = _error_line(p)
  assert f"checkpoint {wd}/checkpoints/4 could not be saved: file too large, over a file-size limit" in line, line
  assert "the last good checkpoint, 2, is intact" in line and "partial folder was removed" in line, line
  # No traceback of Python's but TensorStore's late write callbacks, which the file-size limit makes
  # print 'Event loop is closed' from C++ threads (a full tmpfs measured by hand printed none). Those
  # threads print at once, their tracebacks interleaved piece by piece: the exceptions named are counted.
  assert set(re.findall(r"[A-Z]\w*?Error", p.stderr)) <= {"RuntimeError"}, p.stderr[-3000:]
  assert p.stderr.count("RuntimeError") == p.stderr.count("Event loop is closed"), p.stderr[-3000:]
  assert "never retrieved" not in p.stderr and not re.search(r"^E\d{4} ", p.stderr, re.M), p.stderr[-3000:]
  assert os.listdir(wd / "checkpoints") == ["2"]   # stopped before the next save (6) was started
  bigger = tmp_path / "bigger_disk" / "run"
  shutil.copytree(wd, bigger)
  p = _run(cmd(bigger))
  assert p.returncode == 0, p.stderr[-3000:]
  assert "resuming from step 2" in p.stderr and _steps(bigger) == [2, 4, 6]


_HOLD_LOCK = """
import sys
from mlm_jax.workdir import lock
with lock.held(sys.argv[1], 72.0):
  print("held", flush=True)
  sys.stdin.read()
"""


def test_a_held_workdir_refuses_a_second_run_and_a_dead_holder_is_taken_over(tmp_path, corpus_and_tokenizer,
                                                                             two_step_run):
  wd = _copy_of(two_step_run, tmp_path)
  before = sorted(str(x.relative_to(wd)) for x in wd.rglob("*"))
  holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(wd)], cwd=REPO, env=cpu_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    p = _run(_cmd(wd, corpus_and_tokenizer, steps=2))
    assert p.returncode == 1
    line = _error_line(p)
    assert f"workdir {wd} is in use by another run" in line and f"pid {holder.pid}," in line, line
    after = sorted(str(x.relative_to(wd)) for x in wd.rglob("*"))
    assert after == sorted(before + ["lock.json"])   # the holder's lock; the refused run wrote nothing
    assert json.loads((wd / "lock.json").read_text())["pid"] == holder.pid
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  p = _run(_cmd(wd, corpus_and_tokenizer, steps=2))
  assert p.returncode == 0, p.stderr[-3000:]
  assert "taking over the lock of host" in p.stderr and f"pid {holder.pid}," in p.stderr
  assert "its process is gone" in p.stderr and not (wd / "lock.json").exists()


def test_a_folder_that_is_not_a_run_is_refused_in_one_line(tmp_path, corpus_and_tokenizer):
  """A transformers folder given as --workdir: refused before anything is written, its config.json
  untouched, and the message is on the console once (the error line, not also a log line)."""
  hf = tmp_path / "hf_model"
  hf.mkdir()
  text = json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 64})
  (hf / "config.json").write_text(text)
  p = _run(_cmd(hf, corpus_and_tokenizer, steps=2))
  assert p.returncode == 1
  line = _error_line(p)
  assert "config.json is not an mlm_jax run's" in line and "model_type='bert'" in line, line
  assert sum("is not an mlm_jax run's" in l for l in p.stderr.splitlines()) == 1, p.stderr[-3000:]
  assert (hf / "config.json").read_text() == text and sorted(os.listdir(hf)) == ["config.json"]
