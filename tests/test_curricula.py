"""Curricula (mlm_jax/config/curricula.py): mask rate, language-sampling exponent and staged sources as pure
functions of the step, on the real masking code and a real token store (test_store's)."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from mlm_jax.objectives import masking
from mlm_jax.config import curricula
from mlm_jax.config import defaults
from mlm_jax.data.store import loader
from mlm_jax.data.store import prepare
from mlm_jax.config.defaults import masking_defaults
from mlm_jax.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def store(corpus_and_tokenizer, shared_data, tmp_path_factory):
  """Two sources, 'de' (a German book) and 'en' (the demo corpus), with the session's demo tokenizer."""
  corpus, spm = corpus_and_tokenizer
  root = str(tmp_path_factory.mktemp("curricula") / "store")
  sources = (f"de={shared_data / 'corpus/de/gutenberg_kalamine/de_alice.txt.gz'}", f"en={corpus}")
  prepare.prepare(prepare.Options(sources=sources, tokenizer=spm, eval_percent=2.0), root, progress_s=1e9,
                  log=lambda s: None)
  return root


def _cfg(root, tmp_path, **kw):
  c = defaults.data_defaults()
  c.sources, c.seq_len = (f"store:{root}",), 32
  c.update(kw)
  return c


def _pipe(c, tmp_path, batch=8):
  return loader.StorePipeline(c, batch, seed=3, cache_dir=str(tmp_path / "index"))


def test_schedule_values_at_phase_boundaries_host_and_traced():
  steps, values = curricula.parse(("0:0.3", "100:0.15", "300:0.05"), "k")
  for mode, want in (("constant", {0: .3, 99: .3, 100: .15, 299: .15, 300: .05, 10**6: .05}),
                     ("linear", {0: .3, 50: .225, 100: .15, 200: .1, 300: .05, 10**6: .05})):
    for s, v in want.items():
      assert curricula.value_at(steps, values, s, mode) == pytest.approx(v)
      traced = jax.jit(lambda t: curricula.value_at_traced(steps, values, t, mode))(jnp.int32(min(s, 2**30)))
      assert float(traced) == pytest.approx(v, abs=1e-6)
  for bad, msg in ((("5:0.1",), "must start at step 0"), (("0:0.1", "0:0.2"), "must increase"),
                   (("0=0.1",), "bad phase")):
    with pytest.raises(ConfigError, match=msg):
      curricula.parse(bad, "masking.mask_rate_schedule")


def test_mask_rate_schedule_slots_sized_for_max_and_rate_applied():
  cfg = masking_defaults()
  cfg.update(mask_rate=0.15, mask_rate_schedule=("0:0.3", "10:0.15", "20:0.05"), mask_id=99, special_ids=(0, 1, 2))
  assert masking.max_predictions(cfg, 128, "cpu") == 39   # ceil(0.3 * 128): the schedule's maximum
  cfg.max_predictions = 39                                 # as resolve.bind_platform writes it
  from mlm_jax.objectives.mlm import MLM
  config = ml_collections.ConfigDict(dict(masking=cfg, model=dict(vocab_size=100), loss=defaults.loss_defaults()))
  objective = MLM.step(config)
  ids = jnp.asarray(np.random.default_rng(0).integers(3, 99, (4, 128)), jnp.int32)
  batch = dict(input_ids=ids, segment_ids=jnp.ones_like(ids), positions=jnp.broadcast_to(jnp.arange(128), ids.shape))
  prepare = jax.jit(objective.prepare)   # one compilation for every step
  for step, rate in ((0, .3), (9, .3), (10, .15), (25, .05)):
    out = prepare(batch, jax.random.key(0), jnp.int32(step))
    assert out["masked_weights"].shape == (4, 39)
    assert float(out["masked_weights"].sum()) == 4 * round(rate * 128)
    assert objective.schedule_values(step) == {"mask_rate": pytest.approx(rate)}
  assert prepare._cache_size() == 1


def _sources_of(pipe, rows):
  src, packed = pipe._locate(np.asarray(rows, np.int64))
  return src, packed


def test_staged_source_and_alpha_phases_resume_exactly(store, tmp_path):
  c = _cfg(store, tmp_path, mix_alpha=1.0, source_start_steps=("en=4",), mix_alpha_schedule=("0:1.0", "7:0.0"))
  run = _pipe(c, tmp_path, batch=8)
  en = [s.label for s in run.streams].index("en")
  batches, en_rows = [], []
  for step in range(12):
    batches.append(next(run))
    en_rows.append(run.stats()["sources"]["en"]["rows"])
    if step == 5:
      state = run.get_state()
  # en's rows appear only from step 4 on; from step 7 on the mixture is uniform (alpha 0)
  src, packed = _sources_of(run, np.arange(12 * 8))
  assert not (src[:4 * 8] == en).any() and (src[4 * 8:] == en).any()
  assert en_rows[:4] == [0] * 4 and en_rows[4] > 0
  assert run.stats()["mix_alpha"] == 0.0 and run.stats()["sources"]["en"]["weight"] == pytest.approx(0.5, abs=1e-3)
  assert np.bincount(src[7 * 8:], minlength=2).tolist() == [20, 20]
  # every source's rows are consumed in order across phases: none repeated, none skipped
  for i in (0, 1):
    assert len(set(packed[src == i].tolist())) == int((src == i).sum()) == run.consumed(96)[i]
  again = _pipe(c, tmp_path, batch=8)
  again.set_state(state)
  for want in batches[6:]:
    got = next(again)
    np.testing.assert_array_equal(got["input_ids"], want["input_ids"])
  with pytest.raises(DataError, match="train.batch_size"):
    _pipe(c, tmp_path, batch=4).set_state(state)
  with pytest.raises(DataError, match="names unknown sources"):
    _pipe(_cfg(store, tmp_path, source_start_steps=("fr=3",)), tmp_path)


def test_mmbert_like_config_phases():
  import importlib.util
  from subproc import REPO
  spec = importlib.util.spec_from_file_location("mmbert_like", REPO / "configs" / "mmbert_like.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  for size, (p2, p3) in (("demo", (100, 200)), ("base", (770_000, 970_000))):
    c = mod.get_config(size)
    bounds, phases = curricula.data_phases(c.data)
    assert bounds.tolist() == [0, p2, p3]
    assert [a for a, _ in phases] == [0.7, 0.5, 0.3]
    assert [len(w) for _, w in phases] == [6, 3, 0] and phases[1][1] == {"bn", "hy", "mr"}
    assert [curricula.mask_rate(c.masking, s) for s in (0, p2 - 1, p2, p3)] == [0.3, 0.3, 0.15, 0.05]
    assert masking.max_predictions(c.masking, c.data.seq_len, "cpu") == -(-3 * c.data.seq_len // 10)
    assert {s.split("=")[0] for s in mod.SOURCES} == set(mod.STAGES[0] + mod.STAGES[1]) | {
        "en", "de", "fr", "es", "it", "ru", "zh", "ja"}


def test_mmbert_like_phases_stage_languages_through_each_phase_sources():
  """`:demo_phases` / `:phases`: 8 -> 11 -> 14 languages, each phase's data.sources naming the store's
  sources it trains on; mask rate and alpha per phase, no step curricula; `,store=DIR` moves every phase."""
  import importlib.util
  from subproc import REPO
  from mlm_jax.config import phases as phases_lib
  from mlm_jax.data.store import shards
  spec = importlib.util.spec_from_file_location("mmbert_like", REPO / "configs" / "mmbert_like.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  every = sorted(s.split("=")[0] for s in mod.SOURCES)
  for variant, store, ends in (("demo_phases", "/tmp/mmbert_demo/store", [100, 200, 300]),
                               ("phases,store=/data/mm", "/data/mm", [770_000, 970_000, 1_000_000])):
    c = mod.get_config(variant)
    parsed = phases_lib.parse(c)
    assert [p.end for p in parsed] == ends
    configs = [phases_lib.config_of(c, parsed, k) for k in range(3)]
    stores = [shards.parse_store_spec(x.data.sources[0]) for x in configs]
    assert {root for root, _ in stores} == {store} and all(len(x.data.sources) == 1 for x in configs)
    langs = [names for _, names in stores]
    assert [len(x) for x in langs] == [8, 11, 14] and sorted(langs[2]) == every
    assert set(langs[1]) - set(langs[0]) == set(mod.STAGES[0]) and set(langs[2]) - set(langs[1]) == set(mod.STAGES[1])
    assert [x.masking.mask_rate for x in configs] == [0.3, 0.15, 0.05]
    assert [x.data.mix_alpha for x in configs] == [0.7, 0.5, 0.3]
    assert not any(x.masking.mask_rate_schedule or x.data.mix_alpha_schedule or x.data.source_start_steps
                   for x in configs)
    assert [x.optimizer.schedule for x in configs] == ["constant", "constant", "linear"]
    assert c.data.sources == configs[0].data.sources
