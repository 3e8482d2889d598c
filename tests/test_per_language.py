"""Per-language curves during pretraining: held-out MLM metrics of each named eval source beside the totals
(streaming text and token store), and the probe's CLAMS accuracy per language, on a tiny real trainer."""
import ml_collections
import numpy as np
import pytest

ALICE_DE = "corpus/de/gutenberg_kalamine/de_alice.txt.gz"
LEIPZIG_EN = "corpus/en/leipzig/eng_news-typical_2016_10K-sentences.txt.gz"


@pytest.fixture(scope="module")
def run(corpus_and_tokenizer, shared_data, tmp_path_factory):
  """A resolved 1-layer, 16-wide pretraining run with the session's tokenizer, English and German held-out
  text as two named eval sources, probing CLAMS in de and en; its trainer and fresh parameters."""
  from mlm_jax.config.defaults import default_config
  from mlm_jax.model import sharding
  from mlm_jax.training import resolve, trainer as trainer_lib
  corpus, spm = corpus_and_tokenizer
  c = default_config()
  c.demo_corpus = False
  c.model.update(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=34)
  c.data.update(seq_len=32, tokenizer=spm, sources=(f"docs={corpus}",),
                eval_sources=(f"en=tsv:1:{shared_data / LEIPZIG_EN}", f"de={shared_data / ALICE_DE}"))
  c.train.update(batch_size=8, eval_batches=2, probe_tasks=("clams",), probe_clams_pairs=5,
                 probe_clams_languages=("en", "de"))
  workdir = str(tmp_path_factory.mktemp("per_language"))
  r = resolve.resolve_pretraining(c, workdir)
  trainer = trainer_lib.make_trainer(r.config, sharding.make_mesh(r.config.mesh), r.objective)
  return r, trainer, trainer.init().params, workdir


def _copy(config):
  return ml_collections.ConfigDict(config.to_dict())


def _make(r, kind="rows"):
  from mlm_jax.data import inputs
  return lambda config: inputs.make_input(config, kind, r.tokenizer, "eval")


def test_held_out_metrics_per_named_eval_source(run):
  """eval_loss/en, eval_accuracy/de, ... beside the totals; each is the evaluator's result on that source's
  eval split alone, and the totals pool them (the whole split's first batches are English's alone); with
  train.eval_per_source=False, the totals only."""
  from mlm_jax.data import inputs
  from mlm_jax.evaluation import heldout
  r, trainer, params, _ = run
  make = _make(r)
  parts = heldout.by_source(r.config, make)
  assert list(parts) == ["en", "de"]
  whole = make(r.config)
  total = heldout.HeldOut(trainer, r.tokenizer, whole)(params, 0)
  both = heldout.HeldOut(trainer, r.tokenizer, whole, parts)(params, 0)
  assert set(total) >= {"eval_loss", "eval_accuracy"}
  assert set(both) == set(total) | {f"{k}/{lang}" for k in total for lang in ("en", "de")}
  for entry in r.config.data.eval_sources:   # the evaluator of a run whose eval split is that source alone
    config = _copy(r.config)
    config.data.eval_sources = (entry,)
    alone = heldout.HeldOut(trainer, r.tokenizer, make(config))(params, 0)
    lang = entry.split("=")[0]
    assert {k: both[f"{k}/{lang}"] for k in alone} == pytest.approx(alone, rel=1e-6)
  assert both["eval_loss/en"] != pytest.approx(both["eval_loss/de"], rel=1e-4)   # different text, not one number
  assert total["eval_loss"] == pytest.approx(both["eval_loss/en"], rel=1e-6)      # the split alone: English first
  # pooled: a mean over both sources' masked pieces, with one weight for every rate of the kind
  w = (both["eval_loss"] - both["eval_loss/de"]) / (both["eval_loss/en"] - both["eval_loss/de"])
  assert 0.2 < w < 0.8
  assert both["eval_accuracy"] == pytest.approx(w * both["eval_accuracy/en"] + (1 - w) * both["eval_accuracy/de"],
                                                abs=1e-6)
  off = _copy(r.config)
  off.train.eval_per_source = False
  assert heldout.by_source(off, make) == {}
  one = _copy(r.config)
  one.data.eval_sources = one.data.eval_sources[:1]
  assert inputs.eval_parts(one) == {}   # one source: the totals are its metrics


def test_held_out_per_source_of_a_token_store(run, corpus_and_tokenizer, shared_data, tmp_path):
  """A store of two sources: its eval split per source, named as the store input names them."""
  from mlm_jax.data import inputs
  from mlm_jax.data.store import prepare
  from mlm_jax.evaluation import heldout
  r, trainer, params, _ = run
  root = str(tmp_path / "store")
  prepare.prepare(prepare.Options(sources=(f"de={shared_data / ALICE_DE}", f"en=tsv:1:{shared_data / LEIPZIG_EN}"),
                                  tokenizer=corpus_and_tokenizer[1], eval_percent=3.0), root, progress_s=1e9,
                  log=lambda s: None)
  config = _copy(r.config)
  config.data.update(sources=(f"store:{root}",), eval_sources=(), tokenizer="")
  parts = inputs.eval_parts(config)
  assert {n: list(c.data.sources) for n, c in parts.items()} == {"de": [f"store:{root}:de"], "en": [f"store:{root}:en"]}
  config.data.sources = (f"web=store:{root}",)
  assert list(inputs.eval_parts(config)) == ["web/de", "web/en"]
  out = heldout.HeldOut(trainer, r.tokenizer, _make(r)(config), heldout.by_source(config, _make(r)))(params, 0)
  assert {"eval_loss", "eval_loss/web/de", "eval_loss/web/en", "eval_accuracy/web/en"} <= set(out)
  assert np.isfinite([out[k] for k in out]).all()


def test_the_probe_scores_clams_per_language(run, shared_data):
  """train.probe_tasks=('clams',): probe/clams/de and probe/clams/en on a fixed sample of probe_clams_pairs pairs
  a language spread over its files, their mean probe/clams; each equals the unpacked PLL reference's count."""
  from mlm_jax.evaluation import pll, probe, zeroshot
  from mlm_jax.tasks import clams
  r, trainer, params, _ = run
  p = probe.Probe(trainer, r.tokenizer)
  out = p(params, 0)
  assert set(out) == {"probe/clams", "probe/clams/de", "probe/clams/en", "probe/clams_seconds"}
  sample = clams.sample(clams.folder(str(shared_data)), 5, ("en", "de"))
  assert sum(len(s.good) for s in sample if s.group == "en") == 5 == sum(len(s.good) for s in sample if s.group == "de")
  assert len({s.name for s in sample if s.group == "en"}) == 5   # one pair from each of 5 of the 22 files
  path, model_cfg = trainer.description.masked_lm(trainer.config)
  longest = pll.max_len(model_cfg)
  unpacked = pll.Scorer(trainer.graphdef, r.tokenizer, longest, path=path, one_per_row=True, max_len=longest)
  ref = zeroshot.score_pairs(unpacked, params, sample)
  for lang in ("de", "en"):
    assert out[f"probe/clams/{lang}"] == pytest.approx(ref["groups"][lang], abs=1e-9), lang
  assert out["probe/clams"] == pytest.approx((out["probe/clams/de"] + out["probe/clams/en"]) / 2)
