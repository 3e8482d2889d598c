"""Earlier workdirs read through the one migration module (workdir/migrate.py): config.json of any layout
version upgraded step by step, checkpoints of older train-state layouts restored into today's, and data
states of earlier forms resumed by today's inputs. (tests/test_round2_fixture.py resumes a whole workdir of
round 2's code.)"""
import hashlib
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mlm_jax.config import phases as phases_lib
from mlm_jax.config import defaults
from mlm_jax.config.defaults import default_config, optimizer_defaults
from mlm_jax.data.store import loader, prepare
from mlm_jax.data.text import stream
from mlm_jax.data.tokenizers import spm_training
from mlm_jax.errors import CheckpointError, DataError
from mlm_jax.training import optim
from mlm_jax.training.trainer import TrainState
from mlm_jax.workdir import checkpoints, files as workdir_files, migrate, restore

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "round2"
DE = "corpus/de/gutenberg_kalamine/*.txt.gz"
EN = "corpus/en/leipzig/eng_news-typical_2016_10K-sentences.txt.gz"


@pytest.fixture(scope="module")
def tok(shared_data, tmp_path_factory):
  """tests/test_store.py's tokenizer: 600 pieces on German and English."""
  root = tmp_path_factory.mktemp("migrate_tok")
  return spm_training.train([f"de={shared_data / DE}", f"en=tsv:1:{shared_data / EN}"], str(root / "spm"),
                            vocab_size=600, max_sentences_per_language=2000, input_sentence_size=4000, verbose=False)


@pytest.fixture(scope="module")
def store(shared_data, tok, tmp_path_factory):
  """tests/test_store.py's store recipe."""
  root = str(tmp_path_factory.mktemp("migrate_store") / "s")
  options = prepare.Options(tokenizer=tok.model_path, eval_percent=2.0,
                            sources=(f"de={shared_data / DE}", f"en=tsv:1:{shared_data / EN}"))
  prepare.prepare(options, root, progress_s=1e9, log=lambda s: None)
  return root


def test_an_older_flat_config_json_is_upgraded_step_by_step():
  """The round-2 fixture's config.json (one flat resolved config, no version) reads as today's layout: the
  tokenizer's ids derived, the fields added since filled in as that run meant them."""
  raw = json.loads((FIXTURE / "workdir" / "config.json").read_text())
  assert migrate.version_of(raw) == 1 and "packing_fit" not in raw["data"]
  record = migrate.config_json(raw)
  assert migrate.version_of(record) == migrate.VERSION == record["version"]
  assert "mask_id" not in record["config"]["masking"]
  assert record["derived"]["masking"]["mask_id"] == raw["masking"]["mask_id"]
  resolved = workdir_files.resolved_of(raw)
  assert resolved.data.packing_fit == "next" and resolved.masking.mask_id == raw["masking"]["mask_id"]
  assert "loss" not in raw and "packing_window" not in raw["data"]
  assert resolved.loss.z_loss == 0.0   # none then
  assert resolved.masking.mask_rate_schedule_mode == "constant" and resolved.data.packing_window == 256
  assert resolved.model.hidden_size == raw["model"]["hidden_size"] == 16
  assert migrate.config_json(record) == record   # today's layout is read as it is
  with pytest.raises(CheckpointError, match="newer than this mlm_jax reads"):
    migrate.config_json({**record, "version": migrate.VERSION + 1})


def test_a_flat_config_json_from_before_the_heads_and_schedules_reads_as_those_runs_meant():
  """A config.json of the first runs: `attention_impl` '' (their name for auto), no embedding_size /
  mlm_head / sentence_head (before ELECTRA and the sentence objectives) and no mask-rate schedule. Read,
  it is today's config of the same run: auto, embeddings as wide as the hidden states, an MLM head and no
  sentence head, a constant rate; it passes today's checks and builds the model those runs trained."""
  from mlm_jax.config import choices, curricula
  from mlm_jax.model import encoder
  raw = json.loads((FIXTURE / "workdir" / "config.json").read_text())
  raw["model"]["attention_impl"] = ""
  for field in ("embedding_size", "mlm_head", "sentence_head"):
    del raw["model"][field]
  for field in ("mask_rate_schedule", "mask_rate_schedule_mode"):
    del raw["masking"][field]
  resolved = workdir_files.resolved_of(raw)
  m = resolved.model
  assert (m.attention_impl, m.embedding_size, m.mlm_head, m.sentence_head) == ("auto", 0, True, False)
  assert tuple(resolved.masking.mask_rate_schedule) == () and resolved.masking.mask_rate_schedule_mode == "constant"
  choices.check_config(resolved)
  assert curricula.mask_rate(resolved.masking, 3) == resolved.masking.mask_rate == 0.15
  _, params = encoder.abstract_model(m)
  assert "head_kernel" in params and "sentence_kernel" not in params and "embeddings_project_kernel" not in params


def test_phases_recorded_before_their_values_read_as_their_overrides_in_order():
  """A phase recorded without `values` is its own overrides over those of the phases before it; a field only
  a later phase sets keeps the last phase's value (config.json's sections)."""
  c = default_config()
  c.data.seq_len = 48
  raw = json.loads(c.to_json_best_effort())
  lr = raw["optimizer"]["learning_rate"]
  raw["phases"] = [[["name", "a"], ["end_step", 5], ["start_step", 0], ["data.seq_len", 32],
                    ["masking.mask_rate", 0.3]],
                   [["name", "b"], ["end_step", 10], ["start_step", 5], ["data.seq_len", 48]],
                   [["name", "c"], ["end_step", 20], ["start_step", 10], ["optimizer.learning_rate", 0.5]]]
  config = workdir_files.resolved_of(raw)
  got = {step: (a.data.seq_len, a.masking.mask_rate, a.optimizer.learning_rate)
         for step in (3, 7, 15) for a in [phases_lib.at_step(config, step)]}
  assert got == {3: (32, 0.3, lr), 7: (48, 0.3, lr), 15: (48, 0.3, 0.5)}


def _params():
  rng = np.random.default_rng(0)
  return {"dense": {"kernel": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
                    "bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}}


def test_an_optimizer_state_of_optax_adamw_resumes_into_todays_chain(tmp_path):
  """Runs before training/optim.py built AdamW's parts in its own chain saved optax.adamw's state nested
  (and, before train.ema_decay, no `ema`): restored, it is today's chain's state, array for array, and the
  next update is the one optax.adamw would make."""
  o = optimizer_defaults()
  o.clip_norm = 1.0
  schedule = optim.make_schedule(o, 100)
  old_tx = optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                                   mask=optim.decay_mask))
  tx = optim.make_optimizer(o, 100)
  params = _params()
  grads = jax.tree.map(lambda p: jnp.sin(p * 3.0), params)
  old_state = old_tx.init(params)
  for _ in range(3):
    _, old_state = old_tx.update(grads, old_state, params)
  old = {"step": jnp.asarray(3, jnp.int32), "params": params, "opt_state": old_state,
         "nonfinite": jnp.asarray(0, jnp.int32)}   # a TrainState as saved before it had `ema`
  ckpt = checkpoints.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(3, old, {"position": 1})
  ckpt.wait()

  today = TrainState(step=jnp.asarray(0, jnp.int32), params=params, opt_state=tx.init(params),
                     nonfinite=jnp.asarray(0, jnp.int32))
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), today)
  restored, data = restore.restore_state(ckpt, 3, abstract)
  ckpt.close()
  assert data == {"position": 1} and restored.ema is None and int(restored.step) == 3
  assert jax.tree.structure(restored.opt_state) == jax.tree.structure(today.opt_state)
  flat_old = jax.tree.leaves(old_state)
  assert len(flat_old) == len(jax.tree.leaves(restored.opt_state))
  for a, b in zip(flat_old, jax.tree.leaves(restored.opt_state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  want, _ = old_tx.update(grads, old_state, params)
  got, _ = tx.update(grads, restored.opt_state, params)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_todays_train_state_restores_as_it_was_saved(tmp_path):
  o = optimizer_defaults()
  tx = optim.make_optimizer(o, 100)
  params = _params()
  state = TrainState(step=jnp.asarray(2, jnp.int32), params=params, opt_state=tx.init(params),
                     nonfinite=jnp.asarray(0, jnp.int32))
  ckpt = checkpoints.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(2, state, {})
  ckpt.wait()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)
  restored, _ = restore.restore_state(ckpt, 2, abstract)
  ckpt.close()
  assert jax.tree.structure(restored) == jax.tree.structure(state)


def _store_pipe(store, tmp_path, **kw):
  c = defaults.data_defaults()
  c.sources, c.seq_len, c.mix_alpha = (f"store:{store}",), 32, 0.5
  c.update(kw)
  return loader.StorePipeline(c, 8, seed=3, cache_dir=str(tmp_path / "index"))


def _resume(pipe, saved: dict):
  """The input continues from `saved` as training/loop.py hands it over: through migrate.data_state."""
  pipe.set_state(migrate.data_state(saved, **pipe.resume_facts()))
  return pipe


# A data state exactly as the store pipeline of c545c96 (the commit before data.packing_fit existed) saved
# it: tests/test_store.py's tokenizer and store recipe, mix_alpha 0.5, seq_len 32, seed 3, batch 8, 3 batches
# read. Only the paths (`sources`, and `stores`, the store's manifest fingerprint) are the fixture's; the rest
# is the literal JSON.
_C545C96_STORE_STATE = {
    "config": {"index_version": 1, "mix_alpha": 0.5, "mix_alpha_schedule": [], "mix_block": 4096,
               "packing": "segmented", "seed": 3, "seq_len": 32, "source_sizes": [], "source_start_steps": [],
               "sources": ["store:STORE"], "split": "train"},
    "fingerprint": "ec134d0cf65d57c0", "kind": "store", "rows": 24, "stores": {"de": "", "en": ""},
    "tokens_local": {"de": 355, "en": 254}, "version": 1}


def test_a_store_state_from_before_packing_fit_resumes_on_its_next_fit_rows(store, tmp_path):
  """A store state that names no fit (saved before data.packing_fit, and naming the store by its path)
  resumes onto the same next-fit rows under the default 'best', which config.json then records; without
  the migration the input refuses it."""
  reference = _store_pipe(store, tmp_path, packing_fit="next")
  want = [next(reference) for _ in range(6)][3:]
  legacy = json.loads(json.dumps(_C545C96_STORE_STATE).replace("STORE", store))
  legacy["stores"] = {k: reference.get_state()["stores"]["de"] for k in legacy["stores"]}
  with pytest.raises(KeyError):
    _store_pipe(store, tmp_path).set_state(legacy)
  first = _resume(_store_pipe(store, tmp_path), legacy)
  assert first.fit == "next" and first.adopted_config() == {"data.packing_fit": "next"}
  for w in want:
    got = next(first)
    assert all((got[k] == w[k]).all() for k in loader.FEATURES)


def test_a_store_state_naming_its_store_by_path_resumes_on_that_path(store, tmp_path):
  """A state written when the config's paths were part of it resumes on those paths, not on a moved copy."""
  run = _store_pipe(store, tmp_path)
  for _ in range(3):
    next(run)
  state = json.loads(json.dumps(run.get_state()))
  want = next(run)
  legacy = dict(state, config=dict(state["config"], sources=[f"store:{store}"]))   # the path, as written before
  with pytest.raises(DataError, match=r"data\.sources changed"):
    _store_pipe(store, tmp_path).set_state(legacy)
  np.testing.assert_array_equal(next(_resume(_store_pipe(store, tmp_path), legacy))["input_ids"], want["input_ids"])
  moved = str(tmp_path / "other_disk" / "store")
  shutil.copytree(store, moved)
  with pytest.raises(DataError, match=r"data\.sources changed"):
    _resume(_store_pipe(moved, tmp_path), legacy)


def _text_cfg(shared_data, **kw):
  c = defaults.data_defaults()
  c.eval_percent, c.sources, c.seq_len = 0.0, (f"en=tsv:1:{shared_data / EN}",), 32
  c.update(kw)
  return c


def _c545c96_fingerprint(c, tok) -> str:
  """A data state's fingerprint as the streaming pipeline of c545c96 (the commit before data.packing_fit
  existed; mlm_jax/data/pipeline.py, Pipeline._fingerprints) computed it, written out here."""
  key = dict(sources=list(c.sources), eval_sources=list(c.eval_sources), eval_percent=c.eval_percent,
             doc_format=c.doc_format, packing=c.packing, mix_alpha=c.mix_alpha, source_sizes=list(c.source_sizes),
             shuffle_buffer=c.shuffle_buffer, shuffle_files=c.shuffle_files, seq_len=c.seq_len,
             tokenize_batch=c.tokenize_batch, vocab_size=tok.vocab_size, tokenizer=tok.sha256)
  return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def test_a_text_state_from_before_packing_fit_resumes_on_its_next_fit_rows(shared_data, tok):
  """A streaming state as c545c96 saved it (a fingerprint without the fit, of the sources' paths; no
  rows_before) resumes onto the same next-fit batches under the best-fit default, which config.json then
  records; without the migration the input refuses it."""
  old = stream.Pipeline(_text_cfg(shared_data, packing_fit="next"), tok, 4, seed=0)
  for _ in range(3):
    next(old)
  legacy = dict(version=1, batches=3, seed=0, split="train", batch_size=4, process_index=0, process_count=1,
                fingerprint=_c545c96_fingerprint(old.config, tok))
  want = [next(old) for _ in range(3)]
  with pytest.raises(DataError, match="the data config differs"):
    stream.Pipeline(_text_cfg(shared_data), tok, 4, seed=0).set_state(legacy)
  first = _resume(stream.Pipeline(_text_cfg(shared_data), tok, 4, seed=0), legacy)
  assert first.fit == "next" and first.adopted_config() == {"data.packing_fit": "next"}
  for w in want:
    got = next(first)
    assert all((got[k] == w[k]).all() for k in stream.FEATURES)


def test_text_fingerprints_of_earlier_forms_resume_the_same_batches(shared_data, tok):
  """Today's fingerprint names the sources by content and holds the tokenizer's sha256; one that held the
  sources' paths, or only the vocabulary size, and a state without process_count or rows_before resume the
  same batches on the same paths; the same stream with another fit or data config is still refused."""
  cfg = _text_cfg(shared_data, shuffle_buffer=50)
  run = stream.Pipeline(cfg, tok, 4, seed=3)
  for _ in range(3):
    next(run)
  state = json.loads(json.dumps(run.get_state()))
  want = next(run)
  key = run.fingerprint_key(run.fit)
  by_path = dict(key, sources=list(cfg.sources), eval_sources=list(cfg.eval_sources))
  earlier = {k: v for k, v in state.items() if k not in ("process_count", "rows_before")}
  for form in (by_path, {k: v for k, v in by_path.items() if k != "tokenizer"}):
    saved = dict(earlier, fingerprint=hashlib.sha256(json.dumps(form, sort_keys=True).encode()).hexdigest()[:16])
    with pytest.raises((DataError, KeyError)):
      stream.Pipeline(cfg, tok, 4, seed=3).set_state(saved)
    resumed = _resume(stream.Pipeline(cfg, tok, 4, seed=3), saved)
    assert resumed.get_state()["fingerprint"] == state["fingerprint"]
    got = next(resumed)
    assert all((got[k] == want[k]).all() for k in stream.FEATURES)
  saved = dict(earlier, fingerprint=hashlib.sha256(json.dumps(by_path, sort_keys=True).encode()).hexdigest()[:16])
  with pytest.raises(DataError, match="the data config differs"):
    _resume(stream.Pipeline(_text_cfg(shared_data, shuffle_buffer=50, packing_fit="next"), tok, 4, seed=3), saved)
  with pytest.raises(DataError, match="the data config differs"):
    _resume(stream.Pipeline(_text_cfg(shared_data, shuffle_buffer=60), tok, 4, seed=3), saved)
