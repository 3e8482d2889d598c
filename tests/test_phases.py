"""A run in phases (config.phases), end to end through `python -m mlm_jax.train`: phase 1 reads the demo
corpus as text at 32 tokens, phase 2 a token store of its first half at 64 tokens with RoPE theta 40k,
phase 3 its second half as text with its own learning-rate segment (and theta 20k, which compiles
nothing), so one run crosses both input paths.
kill -9 right after the boundary into phase 2 and again inside phase 2, then the same command: the
losses of the uninterrupted run, with the text input restored inside phase 1 and the store's inside
phase 2. Then branches and merges of that run, the export of a phase-1 checkpoint with phase 1's
settings, the compiled step that phases share, and bad phases (one line).

One uninterrupted run (`straight`) is the reference of the kill, branch, merge and export tests.
"""
import importlib.util
import json
import os
import signal
import subprocess
import sys

import pytest

from subproc import REPO, cpu_env, kill_when


def _load(path, name):
  spec = importlib.util.spec_from_file_location(name, REPO / path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _demo_config(variant: str = "phases"):
  return _load("configs/demo.py", "demo_config").get_config(variant)


STOP = 16   # the compared steps: phases end at 5 and 10, checkpoints every 4 steps; the decay phase is long
            # (a killed run cannot end first)


def _phases(store: str, decay_source: str, decay_end: int = 400) -> str:
  return ("({'name':'short','end_step':5},"
          f"{{'name':'long','end_step':10,'data.seq_len':64,'model.rope_theta':40000.0,'data.sources':({store!r},)}},"
          f"{{'name':'decay','end_step':{decay_end},'data.sources':({decay_source!r},),'model.rope_theta':20000.0,"
          "'optimizer.schedule':'linear','optimizer.warmup_steps':0,'optimizer.learning_rate':0.001})")


def _cmd(workdir, sources, *more, decay_end: int = 400):
  return [sys.executable, "-m", "mlm_jax.train", "--config=configs/demo.py:phases", f"--workdir={workdir}",
          "--config.demo_corpus=False", f"--config.data.sources=({sources['text']!r},)",
          f"--config.data.tokenizer={sources['spm']}", "--config.data.shuffle_buffer=100",
          "--config.model.hidden_size=64", "--config.model.num_layers=1", "--config.model.num_heads=2",
          "--config.model.intermediate_size=128", "--config.train.batch_size=8", "--config.train.log_every=1",
          "--config.train.eval_every=1000", "--config.train.eval_batches=1", "--config.train.eval_at_start=False",
          "--config.train.save_every=4", "--config.train.keep_checkpoints=5", "--config.train.peak_tflops_per_device=0.1",
          "--config.optimizer.warmup_steps=2",
          "--config.train.ema_decay=0.9",   # the moving average is saved and restored with the state
          f"--config.phases={_phases(sources['store'], sources['decay'], decay_end)}", *more]


def _run(cmd, timeout=400, **env):
  return subprocess.run(cmd, cwd=REPO, env=dict(cpu_env(), **env), capture_output=True, text=True, timeout=timeout)


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


def _same_losses(got: dict, ref: dict, steps) -> None:
  assert sorted(got) == list(steps), sorted(got)
  for s in steps:
    assert got[s][1] == ref[s][1] and abs(got[s][0] - ref[s][0]) <= 1e-6, (s, got[s], ref[s])


def _kill_when_logged(cmd, workdir, ready, log) -> None:
  """Start `cmd` (a run far longer than needed) and kill -9 it once metrics.jsonl holds a line `ready` accepts."""
  with open(log, "w+") as err:   # a file, not a pipe: a full pipe would stall the run
    proc = subprocess.Popen(cmd, cwd=REPO, env=cpu_env(), stdout=subprocess.DEVNULL, stderr=err)
    kill_when(proc, lambda: any(ready(d) for d in _lines(workdir)))
    err.seek(0)
    assert proc.returncode == -signal.SIGKILL, err.read()[-3000:]


def _steps_of(workdir):
  return sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())


@pytest.fixture(scope="module")
def sources(corpus_and_tokenizer, tmp_path_factory):
  """The sources of the three phases: the demo corpus as text, a token store of its first half, its second
  half as text; and the tokenizer."""
  from mlm_jax.data.store import prepare
  corpus, spm = corpus_and_tokenizer
  root = tmp_path_factory.mktemp("phases")
  with open(corpus, encoding="utf-8") as f:
    lines = f.read().splitlines()
  halves = root / "first_half.txt", root / "second_half.txt"
  for path, part in zip(halves, (lines[:len(lines) // 2], lines[len(lines) // 2:])):
    path.write_text("\n".join(part) + "\n", encoding="utf-8")
  store = root / "store_first_half"
  prepare.prepare(prepare.Options(sources=(f"first={halves[0]}",), tokenizer=spm, eval_percent=5.0), str(store),
                  progress_s=1e9, log=lambda s: None)
  return dict(text=f"docs={corpus}", store=f"store:{store}", decay=f"second={halves[1]}", spm=spm)


@pytest.fixture(scope="module")
def straight(sources, tmp_path_factory):
  """The uninterrupted run to STOP (checkpoints 4, 8, 12 and 16): the reference of the tests below. Its
  train step is compiled twice (JAX_LOG_COMPILES): for phase 1 and for phase 2, whose sequences are
  longer; phase 3 changes RoPE theta, the learning rate and the data, no shape, and runs phase 2's."""
  workdir = tmp_path_factory.mktemp("phases_run") / "straight"
  p = _run(_cmd(workdir, sources, f"--config.train.stop_at_step={STOP}"), JAX_LOG_COMPILES="1")
  assert p.returncode == 0, p.stderr[-3000:]
  ref = _losses(workdir)
  assert sorted(ref) == list(range(1, STOP + 1))
  assert [ref[s][1] for s in (5, 6, 10, 11)] == ["short", "long", "long", "decay"]
  assert "phase 2/3 'long': steps 5..10, global batch 8 x 64 tokens" in p.stderr
  assert f"step 11/{STOP} [decay]" in p.stderr
  assert p.stderr.count("Compiling jit(train_step) ") == 2, [l for l in p.stderr.splitlines() if "train_step" in l]
  assert _steps_of(workdir) == [4, 8, 12, 16]
  from mlm_jax.workdir import files
  recorded = files.read_config(str(workdir))   # the phases' record is derived: in config.json's "derived"
  assert [dict(x)["end_step"] for x in recorded["phases"]] == [5, 10, 400] and recorded["data"]["seq_len"] == 64
  return workdir


def test_kill_9_right_after_a_boundary_and_inside_phase_2_resumes_exactly(sources, straight, tmp_path):
  """Killed while it enters phase 2 (the boundary's evaluation is logged; the newest checkpoint, 4, is
  phase 1's): the rerun restores the text input inside phase 1 and enters the store phase again. Killed
  again inside phase 2 (after step 9; checkpoint 8): the rerun restores the store's position inside
  phase 2 and enters the text phase 3. The losses are those of the uninterrupted run, and so is the EMA."""
  killed, ref = tmp_path / "killed", _losses(straight)
  saved = lambda step: os.path.isdir(killed / "checkpoints" / str(step))   # committed (orbax renames it last)
  _kill_when_logged(_cmd(killed, sources), killed, lambda d: d["step"] == 5 and "eval_loss" in d and saved(4),
                    tmp_path / "k1.log")
  assert _steps_of(killed) == [4]
  _kill_when_logged(_cmd(killed, sources), killed, lambda d: d["step"] >= 9 and "loss" in d and saved(8),
                    tmp_path / "k2.log")
  assert _steps_of(killed) == [4, 8]
  p = _run(_cmd(killed, sources, f"--config.train.stop_at_step={STOP}"))
  assert p.returncode == 0, p.stderr[-3000:]
  assert "resuming from step 8" in p.stderr
  _same_losses(_losses(killed), ref, range(1, STOP + 1))
  # the EMA's held-out loss at the end: restored with the state, it is the uninterrupted run's
  ema = [[d for d in _lines(w) if "eval_ema_loss" in d and d["step"] == STOP][0] for w in (straight, killed)]
  assert ema[0]["eval_ema_loss"] != ema[0]["eval_loss"]
  assert abs(ema[1]["eval_ema_loss"] - ema[0]["eval_ema_loss"]) <= 1e-6, ema


def _tree(workdir):
  return {os.path.relpath(os.path.join(d, f), workdir): os.stat(os.path.join(d, f)).st_mtime_ns
          for d, _, fs in os.walk(workdir) for f in fs}


def test_branch_continues_exactly_and_a_decay_branch_trains(sources, straight, tmp_path):
  """A branch from step 8 (inside the store phase) with no overrides gives the source's losses after 8,
  across the boundary into phase 3; a branch from step 16 that ends the decay phase at 19 decays there;
  a step without a checkpoint is one line; the source is never written."""
  from mlm_jax.errors import CheckpointError
  from mlm_jax.workdir import branch
  before = _tree(straight)
  same = tmp_path / "same"
  p = _run(_cmd(same, sources, f"--config.branch_from={straight}:8", f"--config.train.stop_at_step={STOP}"))
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"branching from {straight}:8" in p.stderr
  _same_losses(_losses(same), _losses(straight), range(9, STOP + 1))

  p = _run(_cmd(tmp_path / "decay", sources, f"--config.branch_from={straight}:16", decay_end=19))
  assert p.returncode == 0, p.stderr[-3000:]
  lines = [d for d in _lines(tmp_path / "decay") if "loss" in d]
  assert [d["step"] for d in lines] == [17, 18, 19]
  assert lines[-1]["learning_rate"] < 0.25 * 1e-3 and all(0 < d["loss"] < 7.5 for d in lines)

  with pytest.raises(CheckpointError) as e:   # what the binary says before it writes anything
    branch.check(f"{straight}:7", str(tmp_path / "missing"))
  assert "no checkpoint for step 7" in str(e.value) and "have 4, 8, 12, 16" in str(e.value) and "\n" not in str(e.value)
  assert _tree(straight) == before


def test_merge_is_the_mean_and_exports_and_an_early_checkpoint_exports_with_its_phase(straight, tmp_path, capsys):
  """tools/merge_checkpoints.py of steps 12 and 16 (phase 3) is the numpy mean and exports to transformers;
  the EMA exports; checkpoint 4 (phase 1) exports with phase 1's RoPE theta (10k, where config.json's
  sections are the last phase's: 20k), and transformers' logits of it are our model's at that theta;
  checkpoints of phases with another theta do not merge (one line)."""
  import jax
  import numpy as np
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  from mlm_jax.workdir import files, merge, restore
  merge_tool = _load("tools/merge_checkpoints.py", "merge_checkpoints")
  convert = _load("tools/convert_checkpoint.py", "convert_checkpoint")
  out = tmp_path / "merged"
  assert merge_tool.main([f"--workdir={straight}", "--steps=12,16", f"--out={out}"]) == 0
  config = files.read_config(str(straight))
  a, b, m = (merge._params(str(w), config, s) for w, s in ((straight, 12), (straight, 16), (out, 16)))
  for x, y, z in zip(jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(m)):
    np.testing.assert_allclose(np.asarray(z), (np.asarray(x, np.float64) + np.asarray(y, np.float64)) / 2, rtol=1e-6)

  ids = torch.tensor([[0] + list(range(10, 400, 17)) + [2]])   # 25 tokens: RoPE theta matters at these positions

  def hf_logits(workdir, *flags):
    folder = tmp_path / f"hf{len(os.listdir(tmp_path))}"
    assert convert.main(["to_hf", f"--workdir={workdir}", f"--out={folder}", *flags]) == 0
    model = transformers.AutoModelForMaskedLM.from_pretrained(str(folder), attn_implementation="eager")
    with torch.no_grad():
      return json.load(open(folder / "config.json")), model(input_ids=ids).logits.numpy()[0]

  hcfg, merged = hf_logits(out)
  assert hcfg["architectures"] == ["ModernBertForMaskedLM"] and hcfg["global_rope_theta"] == 20_000.0
  assert config.model.rope_theta == 20_000.0   # config.json: the last phase's
  _, ema = hf_logits(straight, "--ema")   # the EMA exports too, and is not the parameters
  assert np.isfinite(merged).all() and np.isfinite(ema).all() and not np.allclose(ema, merged, atol=1e-3)

  hcfg, early = hf_logits(straight, "--step=4")
  assert hcfg["global_rope_theta"] == hcfg["local_rope_theta"] == 10_000.0
  assert hcfg["rope_parameters"]["full_attention"]["rope_theta"] == 10_000.0

  def ours(theta):
    mcfg = config.model.copy_and_resolve_references()
    mcfg.update(dict(rope_theta=theta, attention_impl="xla"))
    graphdef, params, step = restore.restore_model(str(straight), mcfg, 4)
    from flax import nnx
    model, x = nnx.merge(graphdef, params), jax.numpy.asarray(ids.numpy(), jax.numpy.int32)
    hidden = model(x, jax.numpy.ones_like(x), jax.numpy.arange(x.shape[1])[None])
    return np.asarray(model.mlm_logits(hidden))[0]

  # At step 4 attention is still nearly uniform, so theta moves the logits little (~5e-5 from 10k to the
  # last phase's 20k), yet far more than transformers and our model differ at the same theta (~3e-7).
  at_10k, at_20k = (np.abs(early - ours(theta)).max() for theta in (10_000.0, 20_000.0))
  assert at_10k < 5e-6 and at_20k > 10 * at_10k, (at_10k, at_20k)

  capsys.readouterr()
  assert merge_tool.main([f"--workdir={straight}", "--steps=8,16", f"--out={tmp_path / 'bad'}"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert "model.rope_theta=20000.0 vs 40000.0" in err[-1], err
  assert not os.path.exists(tmp_path / "bad")


def test_a_refused_phased_run_changes_nothing(tmp_path, corpus_and_tokenizer):
  """What `python -m mlm_jax.train` runs after its flags (train_and_evaluate): one line, before the workdir
  (which it locks meanwhile) is changed."""
  from mlm_jax import train
  from mlm_jax.errors import ConfigError
  corpus, spm = corpus_and_tokenizer
  wd = tmp_path / "run"
  wd.mkdir()
  (wd / "keep.txt").write_text("x")
  config = _demo_config()
  config.demo_corpus = False
  config.data.sources, config.data.tokenizer = (f"docs={corpus}",), spm
  config.phases = ({"name": "a", "end_step": 8, "model.hidden_size": 128},)
  with pytest.raises(ConfigError) as e:
    train.train_and_evaluate(config, str(wd))
  assert "model.hidden_size cannot change mid-run" in str(e.value) and "\n" not in str(e.value)
  assert sorted(os.listdir(wd)) == ["keep.txt"]


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


def test_a_phase_that_changes_only_theta_and_the_mask_rate_runs_the_compiled_step_of_the_one_before(shared_data):
  """Phase b changes RoPE theta (10k -> 40k) and the mask rate (0.13 -> 0.156: still 5 prediction slots of
  32 tokens): its trainer runs phase a's compiled steps (one executable in the cache after both ran) with
  its own values, which give exactly the numbers of a trainer built for b alone. Phase c (64 tokens) has
  its own. (The held-out step here, which is cheaper to compile; the train step is bound alike, and the
  straight run above counts its compilations.)"""
  import jax
  import textdata
  from flax import nnx
  from mlm_jax.config import phases as phases_lib
  from mlm_jax.model import sharding
  from mlm_jax.objectives.mlm import MLM
  from mlm_jax.training import phase_runner, resolve, trainer as trainer_lib
  config = _demo_config()
  config.model.update(dict(vocab_size=textdata.VOCAB, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=1))
  config.masking.update(dict(mask_id=textdata.MASK, special_ids=textdata.SPECIALS, mask_rate=0.13))
  config.train.batch_size = 4
  config.mesh.update(dict(data=1, fsdp=1, tensor=1))
  config.phases = ({"name": "a", "end_step": 2},
                   {"name": "b", "end_step": 4, "model.rope_theta": 40_000.0, "masking.mask_rate": 0.156},
                   {"name": "c", "end_step": 6, "data.seq_len": 64})
  parsed = phases_lib.parse(config)
  configs = resolve.resolve_phases(config, parsed, "cpu", MLM)
  assert [c.masking.max_predictions for c in configs] == [5, 5, 10]
  mesh = sharding.make_mesh(configs[0].mesh, jax.devices()[:1])
  stages = phase_runner.PhaseSet(parsed, list(configs), mesh, MLM, make_io=None)
  a, b, c = (stages.trainer(k) for k in range(3))
  alone = trainer_lib.make_trainer(configs[1], mesh, MLM, schedule=stages.schedule)
  assert b.train_step is a.train_step and b.eval_step is a.eval_step
  assert c.train_step is not a.train_step   # another program: compiled when phase c runs
  params = nnx.state(MLM.make_model(configs[0]), nnx.Param)
  sp, lines = textdata.load(shared_data)
  batch = textdata.packed_batches(sp, lines, seq_len=32, max_rows=4)
  ma, mb, m_alone = (jax.device_get(t.eval_step(params, batch, jax.random.key(0), t.values)) for t in (a, b, alone))
  assert a.eval_step._cache_size() == 1   # b ran a's executable
  assert b.config.model.rope_theta == 40_000.0 and mb["num_predictions"] != ma["num_predictions"]
  assert mb["loss_sum"] == m_alone["loss_sum"] != ma["loss_sum"]


def test_explicit_prediction_slots_below_the_mask_rate_are_refused_also_after_a_phase_lengthens_rows():
  """masking.max_predictions=5 holds 15% of 32 tokens; phase b's 64-token rows would silently mask 7.8%."""
  import textdata
  from mlm_jax.config import phases as phases_lib
  from mlm_jax.errors import ConfigError
  from mlm_jax.objectives.mlm import MLM
  from mlm_jax.training import resolve
  config = _demo_config()
  config.model.update(dict(vocab_size=textdata.VOCAB))
  config.masking.update(dict(mask_id=textdata.MASK, special_ids=textdata.SPECIALS, mask_rate=0.15, max_predictions=5))
  config.data.seq_len = 32
  config.phases = ({"name": "a", "end_step": 2}, {"name": "b", "end_step": 4, "data.seq_len": 64})
  with pytest.raises(ConfigError) as e:
    resolve.resolve_phases(config, phases_lib.parse(config), "cpu", MLM)
  assert str(e.value) == ("phase 'b': masking.max_predictions=5 holds 7.8% of a 64-token row, below the mask rate "
                          "0.15: set it to at least 10, or to 0 (sized from the rate)")
  config.phases = ({"name": "a", "end_step": 2}, {"name": "b", "end_step": 4, "data.seq_len": 64,
                                                  "masking.max_predictions": 10})
  assert [c.masking.max_predictions for c in resolve.resolve_phases(config, phases_lib.parse(config), "cpu", MLM)] == [5, 10]


@pytest.mark.parametrize("path", ["text", "store"])
def test_phases_that_change_only_the_batch_continue_the_data_order(sources, path):
  """Phases that change the batch size, the learning rate and the mask rate read one order of rows: phase
  b (batch 8) starts on the row after the last that phase a (batch 4) read, as one phase with either
  batch would. Phase c changes the sequence length: a new order, of its own seed. Checked on the rows
  the phases' inputs really give (the inputs the binary makes, training/phase_runner + data/inputs)."""
  import numpy as np
  from mlm_jax.config import phases as phases_lib
  from mlm_jax.data import inputs
  from mlm_jax.data.tokenizers import load as tokenizer_load
  from mlm_jax.objectives.mlm import MLM
  from mlm_jax.training import phase_runner, resolve
  config = _demo_config("")
  config.data.sources = (sources[path],)
  config.data.tokenizer = sources["spm"]
  config.data.shuffle_buffer = 100
  config.train.batch_size = 4
  config.phases = ({"name": "a", "end_step": 3},
                   {"name": "b", "end_step": 5, "train.batch_size": 8, "optimizer.learning_rate": 1e-4,
                    "masking.mask_rate": 0.2},
                   {"name": "c", "end_step": 6, "data.seq_len": 32})
  tok = tokenizer_load.load(sources["spm"])
  resolve.bind_tokenizer(config, tok)
  parsed = phases_lib.parse(config)
  configs = resolve.resolve_phases(config, parsed, "cpu", MLM)
  made = []

  def make_io(cfg, input_config, trainer, rows_before):
    made.append((input_config.seed, rows_before))
    return inputs.LoopInput(inputs.make_input(input_config, "rows", tok, rows_before=rows_before)), None, None

  stages = phase_runner.PhaseSet(parsed, list(configs), None, MLM, make_io)
  stages.trainer = lambda k: None   # the inputs alone are compared here; no step is compiled
  rows = []
  for k, phase in enumerate(parsed[:2]):
    parts = stages.enter(k)
    rows += [r for s in range(phase.start, phase.end) for r in parts.input.batch(s)["input_ids"]]
  one_order = inputs.make_input(phase_runner.input_config(configs[0], 0), "rows", tok)
  want = [r for _ in range(7) for r in next(one_order)["input_ids"]]   # 3 x 4 + 2 x 8 = 28 rows
  assert len(rows) == len(want) == 28
  np.testing.assert_array_equal(np.stack(rows), np.stack(want))
  stages.enter(2)
  assert made == [(config.seed, 0), (config.seed, 12), (config.seed + 2, 0)]
