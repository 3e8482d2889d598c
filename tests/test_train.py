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
          # one evaluation, at the end: the demo's evaluation before step 1 costs every run a second one
          "--config.train.eval_every=1000", "--config.train.eval_at_start=False", "--config.train.eval_batches=2",
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


def _truncate_largest_file(folder):
  biggest = max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  with open(biggest, "r+b") as f:
    f.truncate(biggest.stat().st_size // 2)


# ELECTRA on the same model: 32-wide shared embeddings, a 16-wide generator (1/4), positions from 0
# as transformers' ELECTRA numbers them. A small learning rate keeps the discriminator near its
# initialization, whose logits straddle 0: at the demo's rate it says 'kept' everywhere by step 6 (the base
# rate), and precision and recall of 0 would be the same number however they were computed.
ELECTRA = ("--config.objective=electra", "--config.model.embedding_size=32", "--config.model.position_offset=0",
           "--config.model.max_position_embeddings=64", "--config.optimizer.learning_rate=1e-4")


@pytest.fixture(scope="module")
def electra_run(tmp_path_factory, corpus_and_tokenizer, shared_data):
  """A finished 12-step ELECTRA run (checkpoints 6 and 12), exported and checked against its checkpoints.
  It evaluates and probes its discriminator before step 1 and every 6 steps, and scores its generator on
  1 BLiMP pair of each paradigm. Next fit packs its rows, which leaves padding in some batches."""
  wd = tmp_path_factory.mktemp("electra") / "run"
  p = _run(_cmd(wd, corpus_and_tokenizer, *ELECTRA, "--config.train.save_every=6", "--config.train.eval_every=6",
                "--config.train.eval_at_start=True", "--config.train.probe_every=6",
                "--config.train.probe_tasks=('sms_spam','pos','blimp')", "--config.train.probe_train_examples=64",
                "--config.train.probe_eval_examples=32", "--config.train.probe_blimp_pairs=1",
                "--config.data.packing_fit=next", "--config.train.ema_decay=0.5", steps=12))
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


def test_kill_9_during_a_save_then_a_moved_copy_resumes_exactly(tmp_path, corpus_and_tokenizer, docs_store):
  """ELECTRA (two towers in the train state) from a token store whose batches 2 worker processes build,
  killed with -9 while an async save is being written: the workers end with it. The workdir and the store
  then copied to another disk, the newest committed checkpoint truncated on the way: the rerun there takes
  over the dead run's lock, sets the truncated checkpoint aside (kept, as <step>.corrupt), resumes from the
  one before it and logs the losses the killed run logged for the same steps (params, optimizer state, data
  position and masks restored). The store's fingerprint holds no path, so the moved store is the same data.
  The streaming text path is killed and resumed in tests/test_goodput.py, moved in the failed-save test below."""
  _, spm = corpus_and_tokenizer
  moved = tmp_path / "other_disk" / "store"

  def cmd(workdir, store, steps):
    # Saves every 2 steps: when the kill lands on a save in progress, the checkpoint before the newest
    # committed one is at least 2 logged steps behind, so the comparison below covers a step after the
    # restored optimizer state has been used, whichever save the kill interrupts.
    out = _cmd(workdir, (store, spm), *ELECTRA, "--config.data.store_workers=2", "--config.train.save_every=2",
               steps=steps)
    # a tuple flag given twice is appended to: replace the text source
    return [f"--config.data.sources=('store:{store}',)" if a.startswith("--config.data.sources=") else a for a in out]

  # A run that cannot end by itself (RUNS_ON steps), killed with -9 once two checkpoints are committed
  # and the next one is being written (a save lasts far longer than a poll: the run waits on its saves).
  killed = tmp_path / "killed"
  log = open(tmp_path / "killed.log", "w+")   # a file, not a pipe: a full pipe would stall the run
  proc = subprocess.Popen(cmd(killed, docs_store, RUNS_ON), cwd=REPO, env=cpu_env(), stdout=subprocess.DEVNULL,
                          stderr=log)
  workers = []

  def ready():   # the store's workers seen at that moment
    if len(_steps(killed)) >= 2 and any("tmp" in x for x in os.listdir(killed / "checkpoints")):
      workers.extend(_store_workers(proc.pid))
      return True
    return False

  kill_when(proc, ready)
  log.seek(0)
  assert proc.returncode == -signal.SIGKILL, log.read()[-3000:]
  assert len(workers) == 2
  deadline = time.time() + 20
  while _alive(workers) and time.time() < deadline:   # a worker ends when its stdin closes
    time.sleep(0.1)
  assert not _alive(workers)
  before = _losses(killed)   # what the run logged until the kill: an uninterrupted run's losses
  *_, previous, newest = _steps(killed)
  reached = max(before)
  assert sorted(before) == list(range(1, reached + 1)) and reached >= previous + 2, (sorted(before), previous)

  wd = tmp_path / "other_disk" / "run"
  shutil.copytree(killed, wd)
  shutil.copytree(docs_store, moved)
  _truncate_largest_file(wd / "checkpoints" / str(newest))
  p = _run(cmd(wd, moved, reached + 1))
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"skipped checkpoint {newest}" in p.stderr and f"{newest}.corrupt" in p.stderr, p.stderr[-3000:]
  assert (wd / "checkpoints" / f"{newest}.corrupt").is_dir()
  assert f"resuming from step {previous}" in p.stderr
  assert "taking over the lock of host" in p.stderr and f"pid {proc.pid}," in p.stderr, p.stderr[-3000:]
  assert "its process is gone" in p.stderr and not (wd / "lock.json").exists()   # taken over; released at exit
  got = _losses(wd)
  assert sorted(got) == list(range(1, reached + 2))
  for s in range(previous + 1, reached + 1):
    assert abs(got[s] - before[s]) <= 1e-6, (s, got[s], before[s])
  assert "tok/s (real " in p.stderr   # padding is not work: the console gives the real tokens' share


def test_electra_run_exports_both_towers_and_init_from_takes_the_discriminator(electra_run, tmp_path):
  """to_hf of a trained ELECTRA run: transformers' two models give our logits (1e-4); fill_mask takes
  the generator and refuses the discriminator; fine-tuning's init_from restores the discriminator."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import jax
  import numpy as np
  from flax import nnx
  from mlm_jax.workdir import files as workdir_files
  from mlm_jax.evaluation import fill_mask
  from mlm_jax.model import tree_paths
  from mlm_jax.model.encoder import abstract_model
  from mlm_jax.objectives import electra_model
  from mlm_jax.convert import folders
  from mlm_jax.convert import electra_towers
  from mlm_jax.errors import UserError

  out = tmp_path / "hf"
  summary = folders.to_hf(str(electra_run), str(out))
  assert summary["step"] == 12 and "generator/model.safetensors" in summary["files"]
  config = workdir_files.config_at(str(electra_run))
  _, params, _ = restore.restore_objective(str(electra_run), config)   # the pair
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

  # The moving average of both towers (train.ema_decay) exports through the same ELECTRA converter.
  ema_out = tmp_path / "hf_ema"
  assert folders.to_hf(str(electra_run), str(ema_out), ema=True)["step"] == 12
  _, ema, _ = restore.restore_objective(str(electra_run), config, item="ema")
  from safetensors.numpy import load_file
  flats = electra_towers.tower_flats(ema, config)
  for kind, sub in ((electra_towers.DISCRIMINATOR, "discriminator"), (electra_towers.GENERATOR, "generator")):
    got, raw = (load_file(str(o / sub / "model.safetensors")) for o in (ema_out, out))
    assert got.keys() == raw.keys() and any(not np.array_equal(got[k], raw[k]) for k in got), sub
    np.testing.assert_array_equal(got["electra.embeddings.word_embeddings.weight"], flats[kind]["word_embeddings"])

  lm = fill_mask.load(hf_dir=str(out / "generator"))
  assert fill_mask.fill_mask(lm, "the <mask> is sorted", top_k=3)["masks"][0]["predictions"]
  with pytest.raises(UserError, match="ELECTRA discriminator.*no MLM head"):
    fill_mask.load(hf_dir=str(out / "discriminator"))

  # What `mlm_jax.finetune --init_from=RUN` restores: the discriminator, nothing of the generator.
  ft_cfg = workdir_files.read_config(str(electra_run)).model
  ft_cfg.mlm_head = False
  abstract = restore.single_device(abstract_model(ft_cfg)[1])
  restored = restore.restore_params_for(str(electra_run), ft_cfg, abstract)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(restored), jax.tree.leaves(params["discriminator"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=tree_paths.path_name(path))


def test_electra_run_logs_what_its_batches_and_checkpoints_give(electra_run, shared_data):
  """The run's logged numbers against computations of their own here. Real tokens: each step's logged share
  is that of the non-padding slots of its global batch, re-made from config.json (not the step's count).
  Checkpoints 6 and 12 on the eval batches and masks the run evaluated: the discriminator's precision,
  recall and accuracy at logit 0 and the generator's sampled accuracy counted with numpy; its AUC as the
  share of (replaced, kept) token pairs ordered right, ties half, at the resolution the run documents
  (1024 bins over [-8, 8], electra.AUC_BINS / AUC_RANGE). Probes of checkpoint 12: the probe library on
  the restored discriminator and the same task samples; BLiMP by the unpacked PLL reference (one masked
  copy a row, not the probe's packed rows) of the restored generator."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from mlm_jax.convert import electra_towers
  from mlm_jax.data import inputs
  from mlm_jax.evaluation import heldout, pll, probe
  from mlm_jax.objectives import electra, electra_model, registry
  from mlm_jax.tasks import blimp
  from mlm_jax.workdir import files as workdir_files

  logged = {}
  for m in map(json.loads, (electra_run / "metrics.jsonl").read_text().splitlines()):
    logged.setdefault(m["step"], {}).update(m)
  assert sorted(s for s, m in logged.items() if "probe/token_cosine" in m) == [0, 6, 12]
  config = workdir_files.read_config(str(electra_run))
  tok = workdir_files.load_tokenizer(workdir_files.tokenizer_path(str(electra_run), config))
  objective_class = registry.for_config(config)
  objective = objective_class.step(config)

  train = inputs.make_input(config, objective_class.input_kind, tok, "train")
  padded = 0
  for step in range(1, config.train.steps + 1):
    segment_ids = next(train)["segment_ids"]
    real = (segment_ids > 0).sum() / segment_ids.size
    padded += real < 1
    assert logged[step]["real_fraction"] == pytest.approx(real, rel=1e-6), (step, real)
    assert logged[step]["real_tokens_per_sec"] / logged[step]["tokens_per_sec"] == pytest.approx(real, rel=1e-6)
  assert padded >= 2   # so a count of every slot would fail above

  graphdef = electra_model.abstract_pair(config)[0]
  key = heldout.eval_key(config.seed)

  @jax.jit
  def forward(params, batch):   # the eval step's masks (eval_key) and its forward pass, with the masks
    masked = objective.prepare(batch, key)
    return dict(objective.forward(nnx.merge(graphdef, params), masked), **masked)

  evaluation = inputs.make_input(config, objective_class.input_kind, tok, "eval")
  for step in (6, 12):
    _, params, _ = restore.restore_objective(str(electra_run), config, step)
    outs = [jax.device_get(forward(params, {k: jnp.asarray(v) for k, v in next(evaluation).items()}))
            for _ in range(config.train.eval_batches)]
    evaluation.rewind()   # every evaluation reads the split's first batches
    logits, labels, real = (np.concatenate([o[k].ravel() for o in outs]) for k in ("disc_logits", "labels", "real"))
    said, is_real = logits > 0, real > 0
    replaced, kept = logits[labels > 0], logits[is_real & (labels == 0)]
    slots = np.concatenate([o["masked_weights"].ravel() for o in outs]) > 0
    sampled = np.concatenate([(o["sampled"] == o["masked_labels"]).ravel() for o in outs])[slots]
    bins = lambda x: np.clip(np.floor((x + electra.AUC_RANGE) * (electra.AUC_BINS / (2 * electra.AUC_RANGE))),
                             0, electra.AUC_BINS - 1)
    order = bins(replaced)[:, None] - bins(kept)[None, :]
    m = logged[step]
    assert m["eval_disc_auc"] == pytest.approx(np.mean((order > 0) + 0.5 * (order == 0)), abs=1e-3), step
    assert m["eval_disc_precision"] == pytest.approx((replaced > 0).sum() / max(said[is_real].sum(), 1), abs=1e-6)
    assert m["eval_disc_recall"] == pytest.approx((replaced > 0).mean(), abs=1e-6)
    assert m["eval_disc_accuracy"] == pytest.approx((said == (labels > 0))[is_real].mean(), abs=1e-6)
    assert m["eval_sampled_accuracy"] == pytest.approx(sampled.mean(), abs=1e-6)
    if step == 6:   # a discriminator near its initialization: both kinds of error
      assert 0 < m["eval_disc_precision"] < 1 and 0 < m["eval_disc_recall"] < 1, m

  # The probes of checkpoint 12 (params and m of the last step above).
  disc_path, disc_cfg = objective_class.encoder(config)
  hidden = jax.jit(lambda params, b: getattr(nnx.merge(graphdef, params), disc_path)(
      b["input_ids"], b["segment_ids"], b["positions"], b["token_type_ids"]))
  t = config.train
  tasks = probe.from_suite([n for n in t.probe_tasks if n != "blimp"], tok, config.data.seq_len,
                           disc_cfg.type_vocab_size, t.probe_train_examples, t.probe_eval_examples)
  scores = probe.Probes(tasks, probe.Probe.ROWS)(lambda b: hidden(params, b))
  for name, score in scores.items():
    if not name.endswith("seconds"):
      assert m[name] == pytest.approx(score, abs=1e-6), (name, m[name], score)
  paradigms = blimp.read(blimp.folder(str(shared_data)), t.probe_blimp_pairs)
  assert all(len(p.good) == len(p.bad) == 1 for p in paradigms)   # the mean over pairs is that over paradigms
  gen_path, gen_cfg = objective_class.masked_lm(config)
  longest = pll.max_len(gen_cfg)   # a row as long as the longest sentence: one masked copy each
  unpacked = pll.Scorer(graphdef, tok, longest, path=gen_path, one_per_row=True, max_len=longest)
  ids = pll.encode(tok, [s for p in paradigms for s in p.good + p.bad])
  fits = np.array([len(x) <= longest for x in ids]).reshape(-1, 2).all(1)   # a pair too long for it is wrong
  pll_scores = unpacked(params, [x for k, x in enumerate(ids) if fits[k // 2]])
  good, bad = pll_scores[0::2], pll_scores[1::2]
  # A pair whose two PLLs are within float error of each other may fall either way in the run's packed rows.
  sure, unsure = np.sum(good - bad > 1e-4) / len(fits), np.sum(abs(good - bad) <= 1e-4) / len(fits)
  assert sure <= m["probe/blimp"] <= sure + unsure and unsure < 0.05, (m["probe/blimp"], sure, unsure)


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


def test_a_finished_run_leaves_whole_metrics_events_and_checkpoint(two_step_run):
  """The binary ends with runtime.exit_now (no interpreter teardown, tests/test_cli.py): the last
  metrics line (the closing evaluation), every TensorBoard event and the final checkpoint are whole."""
  import jax
  import numpy as np
  import tensorflow as tf
  from mlm_jax.workdir import files as workdir_files
  lines = (two_step_run / "metrics.jsonl").read_text().splitlines()
  logged = {(d["step"], k): v for d in map(json.loads, lines) for k, v in d.items()
            if k != "step" and isinstance(v, (int, float))}
  assert json.loads(lines[-1])["step"] == 2 and "eval_loss" in json.loads(lines[-1]), lines[-1]
  (events,) = (two_step_run / "tensorboard").glob("events.out.tfevents.*")
  written = {(e.step, v.tag): float(tf.make_ndarray(v.tensor))
             for e in tf.compat.v1.train.summary_iterator(str(events)) for v in e.summary.value}   # checks each record's CRC
  assert written.keys() == logged.keys()
  for key, value in logged.items():
    assert abs(written[key] - value) <= 1e-6 * max(1.0, abs(value)), (key, written[key], value)
  _, params, step = restore.restore_model(str(two_step_run), workdir_files.read_config(str(two_step_run)).model)
  assert step == 2 and all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


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
  import math
  bad = {d["step"] for d in logged if "loss" in d and not math.isfinite(d["loss"])}
  assert bad
  if mode == "stop":   # steps whose loss was not finite were never saved
    assert not bad & set(_steps(wd))
  else:   # a skipped step keeps the last finite parameters, and is saved with them
    import jax
    import numpy as np
    from mlm_jax.workdir import files as workdir_files
    assert bad & set(_steps(wd))
    cfg = workdir_files.read_config(str(wd))
    _, params, _ = restore.restore_model(str(wd), cfg.model, max(bad & set(_steps(wd))))
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


FILE_LIMIT = 100_000   # bytes: below a checkpoint's data files (~150-400 kB), above every other file a run writes


def _small_files():
  """In the child: files may not grow past FILE_LIMIT (EFBIG, as a full disk gives ENOSPC), and the
  signal that limit sends is ignored, so the write fails instead of killing the process."""
  import resource
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def test_a_failed_save_stops_in_one_line_a_moved_copy_resumes_and_sigterm_saves(tmp_path, corpus_and_tokenizer,
                                                                                two_step_run):
  """A save that cannot be written (a file-size limit stands in for a full disk: both fail the write
  inside orbax's background threads) stops the run at that step: exit 1, one error line naming the
  checkpoint, no traceback; checkpoint 2 intact, the partial folder removed. The workdir and its corpus
  copied to another disk (no limit there; the data's fingerprint holds no path) resume from 2 with the
  losses the failed run logged. SIGTERM there (preemption) saves the step it is at and exits 75 (a
  temporary failure: schedulers restart it) with one line; the same command again continues from that step."""
  corpus, spm = corpus_and_tokenizer
  wd = _copy_of(two_step_run, tmp_path)
  p = subprocess.run(_cmd(wd, corpus_and_tokenizer, "--config.train.save_every=2", steps=6), cwd=REPO, env=cpu_env(),
                     capture_output=True, text=True, timeout=300, preexec_fn=_small_files)
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
  failed = _losses(wd)
  assert sorted(failed) == list(range(1, max(failed) + 1)) and max(failed) >= 4, failed

  disk = tmp_path / "bigger_disk"
  moved = disk / "corpus" / os.path.basename(corpus)
  moved.parent.mkdir(parents=True)
  shutil.copy(corpus, moved)
  bigger = disk / "run"
  shutil.copytree(wd, bigger)
  # A run that cannot end by itself and saves only when told to stop: SIGTERM once it has logged a step
  # past those the failed run logged.
  cmd = lambda steps: _cmd(bigger, (str(moved), spm), "--config.train.save_every=1000", steps=steps)
  log = open(tmp_path / "preempted.log", "w+")   # a file, not a pipe: a full pipe would stall the run
  proc = subprocess.Popen(cmd(RUNS_ON), cwd=REPO, env=cpu_env(), stdout=subprocess.DEVNULL, stderr=log)
  try:
    deadline = time.time() + 600   # a hang guard only: a loaded host is slow
    while time.time() < deadline and proc.poll() is None:
      if os.path.exists(bigger / "metrics.jsonl") and max(_losses(bigger), default=0) > max(failed):
        proc.send_signal(signal.SIGTERM)
        break
      time.sleep(0.05)
    proc.wait(timeout=240)
  finally:
    proc.kill()
  log.seek(0)
  err = log.read()
  assert proc.returncode == 75, err[-3000:]
  assert "resuming from step 2" in err
  got = _losses(bigger)
  assert f"preempted: saved step {max(got)}; the same command resumes from it" in err.splitlines()
  for s in range(3, max(failed) + 1):
    assert abs(got[s] - failed[s]) <= 1e-6, (s, got[s], failed[s])
  last_logged = max(got)
  assert _steps(bigger) == [2, last_logged] and last_logged < RUNS_ON

  p = _run(cmd(last_logged + 2))
  assert p.returncode == 0, p.stderr[-3000:]
  assert sorted(_losses(bigger)) == list(range(1, last_logged + 3))
  assert "resuming from step %d" % last_logged in p.stderr


_HOLD_LOCK = """
import sys
from mlm_jax.workdir import lock
with lock.held(sys.argv[1], 72.0):
  print("held", flush=True)
  sys.stdin.read()
"""


def test_a_held_workdir_refuses_a_second_run_in_one_line(tmp_path, corpus_and_tokenizer, two_step_run):
  """The lock of a live holder refuses the run; a dead holder's is taken over in the kill -9 test."""
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
