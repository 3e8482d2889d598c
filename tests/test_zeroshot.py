"""Zero-shot minimal pairs: BLiMP's reader on the real files; the suite on a few real pairs of 3 BLiMP paradigms,
of 2 CLAMS files in each language and of a user's file with a constant model (ties counted wrong), its tables
and JSON; kept results and the PLL variant; one-line errors for bad input."""
import gzip
import json
import os
import pathlib
import re
import shutil

import numpy as np
import pytest

from mlm_jax.errors import DataError, NoMaskedLM, UserError
from mlm_jax.tasks import blimp, clams, minimal_pairs

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "round2"
PARADIGMS = ("anaphor_gender_agreement", "adjunct_island", "regular_plural_subject_verb_agreement_1")
PAIRS = 6
CLAMS_FILES = ("simple_agrmt", "vp_coord")   # in every language; pairs spread over each file
CLAMS_EN = ("simple_reflexives",)            # English only: a language's mean is not the mean over files
CLAMS_PAIRS = 4


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory):
  """A data folder: zeroshot/blimp with the first PAIRS lines of 3 paradigms, and zeroshot/clams with
  CLAMS_PAIRS pairs (every 10th) of 2 files in each of its 5 languages and of a third in English."""
  root = tmp_path_factory.mktemp("blimp_data")
  where = root / blimp.FOLDER
  where.mkdir(parents=True)
  src = shared_data / blimp.FOLDER
  for name in PARADIGMS:
    with gzip.open(src / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
      lines = [next(f) for _ in range(PAIRS)]
    with gzip.open(where / f"{name}.jsonl.gz", "wt", encoding="utf-8") as f:
      f.writelines(lines)
  shutil.copy(src / blimp.PUBLISHED, where / blimp.PUBLISHED)
  for lang in clams.languages(str(shared_data / clams.FOLDER)):
    (root / clams.FOLDER / lang).mkdir(parents=True)
    for name in CLAMS_FILES + (CLAMS_EN if lang == "en" else ()):
      with gzip.open(shared_data / clams.FOLDER / lang / f"{name}.txt.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
      picked = [l for k in range(CLAMS_PAIRS) for l in lines[20 * k:20 * k + 2]]
      with gzip.open(root / clams.FOLDER / lang / f"{name}.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(picked) + "\n")
  return root


def test_reader_on_the_real_files(shared_data):
  where = str(shared_data / blimp.FOLDER)
  first = blimp.read(where, limit=100, paradigms=2)
  assert [p.name for p in first] == ["adjunct_island", "anaphor_gender_agreement"]
  assert all(len(p.good) == len(p.bad) == 100 for p in first) and first[0].phenomenon == "island_effects"
  assert first[0].good[0] == "Who should Derek hug after shocking Richard?"
  published = blimp.published(where)
  assert published["5-gram"]["overall"] == pytest.approx(0.6124, abs=1e-4)
  assert len([k for k in published["GPT-2"] if k in {p.name for p in first}]) == 2


@pytest.fixture(scope="module")
def constant_workdir(tmp_path_factory):
  """A workdir of a 1-layer, 16-wide model with round 2's 400-piece tokenizer whose output is the same for
  every input (head norm and decoder bias zero): every token's log p is -log V, so sentences of the same
  length tie."""
  import jax.numpy as jnp
  from flax import nnx
  from mlm_jax.config.defaults import default_config
  from mlm_jax.model.encoder import Encoder
  from mlm_jax.workdir import checkpoints
  wd = tmp_path_factory.mktemp("constant") / "run"
  shutil.copytree(FIXTURE / "store" / "tokenizer", wd / "tokenizer")
  c = default_config()
  c.data.tokenizer = str(wd / "tokenizer" / "spm.model")
  c.model.update(dict(vocab_size=400, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                      max_position_embeddings=130, type_vocab_size=1, position_offset=2))
  model = Encoder(c.model, seed=0)
  for param in (model.decoder_bias, model.head_norm.scale, model.head_norm.bias):
    param[...] = jnp.zeros_like(param[...])
  ckpt = checkpoints.Checkpointer(str(wd), async_save=False)
  ckpt.save(1, {"params": nnx.state(model, nnx.Param)}, {})
  ckpt.close()
  (wd / "config.json").write_text(c.to_json_best_effort())
  return str(wd)


def _tie_free_verdicts(tok, paradigm) -> str:
  """The constant model's verdict on each pair when ties are wrong: right ("1") where the good sentence is the
  shorter."""
  from mlm_jax.evaluation import pll
  good, bad = pll.encode(tok, paradigm.good), pll.encode(tok, paradigm.bad)
  assert any(len(g) == len(b) for g, b in zip(good, bad))   # ties occur
  return "".join("1" if len(g) < len(b) else "0" for g, b in zip(good, bad))


def test_a_tie_is_wrong(data, constant_workdir, tmp_path, monkeypatch):
  """--tasks=blimp alone with a constant model: a pair is right only where the good sentence has fewer
  tokens (ties wrong); the table shows the overall and the phenomena (3 here, 12 on all of BLiMP) beside the
  paper's rows; the JSON holds every paradigm and every pair's verdict; a re-run reads the result back.
  Scored over many small steps (2 rows each), with a progress line after each step but the last."""
  from mlm_jax.evaluation import fill_mask, zeroshot
  from mlm_jax.finetuning import suite, zeroshot_suite
  tok = fill_mask.from_workdir(constant_workdir).tokenizer
  paradigms = blimp.read(str(data / blimp.FOLDER))
  verdicts = {p.name: _tie_free_verdicts(tok, p) for p in paradigms}
  expected = {name: v.count("1") / len(v) for name, v in verdicts.items()}
  out, lines = str(tmp_path / "suite"), []
  monkeypatch.setattr(zeroshot_suite, "PLL_ROWS", 2)
  monkeypatch.setattr(zeroshot_suite, "PROGRESS_SECONDS", 0)
  summary = suite.run_suite(constant_workdir, out, tasks="blimp", fast=True, data=str(data), log=lines.append)
  progress = [re.fullmatch(r"\[downstream\] blimp: (\d+) of 36 sentences scored \((\d+)%\) in \d+ s, "
                           r"about \d+ s left", l) for l in lines if "sentences scored" in l]
  done = [int(m[1]) for m in progress]
  assert len(done) > 3 and all(m for m in progress) and done == sorted(done) and 0 < done[-1] < 36, lines
  assert [int(m[2]) for m in progress] == [round(100 * d / 36) for d in done]
  z = summary["zeroshot"]["blimp"]
  assert z["paradigms"] == pytest.approx(expected) and z["overall"] == pytest.approx(np.mean(list(expected.values())))
  kept = json.load(open(os.path.join(out, "blimp", zeroshot_suite.RESULT_FILE)))
  assert z["verdicts"] == kept["verdicts"] == verdicts and any("0" in v and "1" in v for v in verdicts.values())
  assert z["pairs"] == 3 * PAIRS and set(z["phenomena"]) == {"anaphor_agreement", "island_effects",
                                                            "subject_verb_agreement"}
  assert summary["tasks"] == {} and summary["zeroshot_average"] == pytest.approx(100 * z["overall"])
  assert list(zeroshot.pair_correct([1.0, 2.0, 3.0], [1.0, 1.0, 4.0])) == [False, True, False]
  table = open(os.path.join(out, "downstream.txt")).read()
  assert re.search(rf"^blimp +acc +{100 * z['overall']:.1f} +- +\dm\d\ds +"
                   rf"\(zero-shot, {3 * PAIRS} pairs, token PLL in float32\)$",
                   table, re.M), table
  assert re.search(r"^average \(zero-shot\) +\d+\.\d", table, re.M) and "average (fine-tuning)" not in table
  assert re.search(r"^phenomenon +this model +5-gram +LSTM +Transformer-XL +GPT-2$", table, re.M)
  assert re.search(rf"^island_effects +{100 * expected['adjunct_island']:.1f} +\d+\.\d", table, re.M)
  assert re.search(r"^overall +\d+\.\d +61\.2 +69\.8 +69\.6 +83\.0$", table, re.M)
  assert json.load(open(os.path.join(out, "downstream.json")))["zeroshot"]["blimp"]["paradigms"] == z["paradigms"]
  lines.clear()
  again = suite.run_suite(constant_workdir, out, tasks="blimp", fast=True, data=str(data), log=lines.append)
  assert any("blimp: done before" in l for l in lines)
  assert again["zeroshot"] == json.loads(json.dumps(summary))["zeroshot"]


def _constant_model_accuracy(tok, pair_set, longest: int = 128) -> float:
  """The constant model's accuracy on a set: right only where the good sentence has fewer tokens (a tie is
  wrong) and both fit the model."""
  from mlm_jax.evaluation import pll
  good, bad = pll.encode(tok, pair_set.good), pll.encode(tok, pair_set.bad)
  return float(np.mean([len(g) < len(b) and max(len(g), len(b)) <= longest for g, b in zip(good, bad)]))


def test_clams_and_a_users_pairs_by_blimps_rules(data, constant_workdir, tmp_path):
  """--tasks=clams,pairs:mine=FILE with the constant model: each set (a language's file; a phenomenon of the
  user's file) scores the share of pairs whose good sentence is the shorter; a language's accuracy is the mean
  over its phenomena, overall the mean over languages; the tables show them. A re-run with --pll=word_l2r
  scores again (the kept result names the variant) and says so in table and JSON, as does --zeroshot_dtype."""
  import jax.numpy as jnp
  from mlm_jax.evaluation import fill_mask, pll
  from mlm_jax.finetuning import suite, zeroshot_suite
  tok = fill_mask.from_workdir(constant_workdir).tokenizer
  sets = clams.read(str(data / clams.FOLDER))
  expected = {s.name: _constant_model_accuracy(tok, s) for s in sets}
  assert 0 < np.mean(list(expected.values())) < 1
  mine = tmp_path / "mine.tsv"
  mine.write_text("good\tbad\tphenomenon\n" "the dog runs\tthe dog run fast\tagreement\n"
                  "the dogs run\tthe dogs runs\tagreement\n" "she sees herself\tshe see herself\tbinding\n")
  out, lines = str(tmp_path / "suite"), []
  summary = suite.run_suite(constant_workdir, out, tasks=["clams", f"pairs:mine={mine}"], data=str(data),
                            log=lines.append)
  z = summary["zeroshot"]["clams"]
  assert z["paradigms"] == pytest.approx(expected) and z["pll"] == "token" and z["pairs"] == 11 * CLAMS_PAIRS
  langs = {lang: np.mean([a for n, a in expected.items() if n.startswith(lang + "/")])
           for lang in ("de", "en", "fr", "he", "ru")}
  assert z["groups"] == pytest.approx(langs) and z["overall"] == pytest.approx(np.mean(list(langs.values())))
  assert z["phenomena"]["vp_coord"] == pytest.approx(np.mean([expected[f"{l}/vp_coord"] for l in langs]))
  m = summary["zeroshot"]["mine"]
  mine_sets = {s.phenomenon: _constant_model_accuracy(tok, s) for s in minimal_pairs.read(str(mine))}
  assert m["phenomena"] == pytest.approx(mine_sets) and m["overall"] == pytest.approx(np.mean(list(mine_sets.values())))
  table = open(os.path.join(out, "downstream.txt")).read()
  assert re.search(rf"^clams +acc +{100 * z['overall']:.1f} +- +\dm\d\ds +"
                   r"\(zero-shot, 44 pairs, token PLL in float32\)$",
                   table, re.M), table
  assert re.search(r"^zero-shot clams \(token pseudo-log-likelihood in float32, a tie is wrong; 44 pairs; "
                   r"the mean of a language over its phenomena", table, re.M), table
  assert re.search(r"^phenomenon +de +en +fr +he +ru$", table, re.M), table
  cells = " +".join(f"{100 * expected[f'{l}/simple_agrmt']:.1f}" for l in langs)
  assert re.search(rf"^simple_agrmt +{cells}$", table, re.M), table
  assert re.search(r"^mean +" + " +".join(f"{100 * a:.1f}" for a in langs.values()) + "$", table, re.M), table
  assert re.search(rf"^binding +{100 * mine_sets['binding']:.1f}$", table, re.M), table
  lines.clear()
  again = suite.run_suite(constant_workdir, out, tasks="clams", data=str(data), pll="word_l2r", log=lines.append)
  assert any("clams: the kept result is of another model or subset (pll 'token' -> 'word_l2r')" in l
             for l in lines), lines
  assert again["zeroshot"]["clams"]["pll"] == "word_l2r" and again["zeroshot"]["clams"]["depends_on"]["pll"] == "word_l2r"
  assert again["zeroshot"]["clams"]["overall"] == pytest.approx(z["overall"])   # every variant: -log V a scored piece
  assert "(zero-shot, 44 pairs, word_l2r PLL in float32)" in open(os.path.join(out, "downstream.txt")).read()
  # --zeroshot_dtype: the same parameters computed in bfloat16, scored again and said so; the model's own
  # dtype (float32 here) otherwise.
  lines.clear()
  bf16 = suite.run_suite(constant_workdir, out, tasks="clams", data=str(data), pll="word_l2r",
                         zeroshot_dtype="bfloat16", log=lines.append)["zeroshot"]["clams"]
  assert any("clams: the kept result is of another model or subset (dtype None -> 'bfloat16')" in l
             for l in lines), lines
  assert any("clams: started (44 pairs, 11 sets, word_l2r PLL in bfloat16)" in l for l in lines), lines
  assert bf16["dtype"] == "bfloat16" and bf16["overall"] == pytest.approx(z["overall"])   # logits all zero
  assert "(zero-shot, 44 pairs, word_l2r PLL in bfloat16)" in open(os.path.join(out, "downstream.txt")).read()
  ids = jnp.asarray(pll.encode(tok, ["the dog runs"]))
  for dtype, expected_dtype in (("", jnp.float32), ("bfloat16", jnp.bfloat16)):
    lm = zeroshot_suite.load_masked_lm(constant_workdir, constant_workdir, False, dtype=dtype)
    hidden = lm.model(ids, jnp.ones_like(ids), jnp.arange(ids.shape[1])[None], None)
    assert hidden.dtype == expected_dtype, (dtype, hidden.dtype)
  # --clams_languages: only those languages' files, each scored as in the run of all five.
  two = suite.run_suite(constant_workdir, str(tmp_path / "two"), tasks="clams", data=str(data),
                        clams_languages=("ru", "de"), log=lines.append)["zeroshot"]["clams"]
  assert two["groups"] == pytest.approx({lang: langs[lang] for lang in ("de", "ru")})
  with pytest.raises(UserError, match=r"^clams: CLAMS has no language 'xx' in .* \(it has de, en, fr, he, ru\)$"):
    suite.run_suite(constant_workdir, str(tmp_path / "xx"), tasks="clams", data=str(data), clams_languages=("xx",))


def test_a_pair_longer_than_the_model_reads_is_wrong_not_an_error(data, constant_workdir):
  """A model with fewer positions than a BLiMP sentence's tokens (the demo's 64 meet 9 of the 67,000 pairs)
  scores every other pair; a pair with a too-long sentence is wrong even where only the good one is too long
  (its unscored PLL must not beat the bad one's), and the summary and the table line count them."""
  from mlm_jax.evaluation import pll, zeroshot
  from mlm_jax.finetuning import suite_report, zeroshot_suite
  lm = zeroshot_suite.load_masked_lm(constant_workdir, constant_workdir, random_init=False)
  scorer, params = zeroshot_suite.scorer_for(lm)
  paradigms = blimp.read(str(data / blimp.FOLDER))
  pairs = [(len(g), len(b)) for p in paradigms
           for g, b in zip(pll.encode(lm.tokenizer, p.good), pll.encode(lm.tokenizer, p.bad))]
  scorer.max_len = min(g - 1 for g, b in pairs if g > b)   # that pair's good sentence no longer fits, its bad one does
  assert any(b <= scorer.max_len < g for g, b in pairs) and any(max(g, b) <= scorer.max_len for g, b in pairs)
  r = zeroshot.score_pairs(scorer, params, paradigms)
  expected, at = {}, 0
  for p in paradigms:
    mine = pairs[at:at + len(p.good)]
    expected[p.name] = float(np.mean([g < b and g <= scorer.max_len and b <= scorer.max_len for g, b in mine]))
    at += len(p.good)
  assert r["paradigms"] == pytest.approx(expected)
  assert r["too_long"] == sum(max(g, b) > scorer.max_len for g, b in pairs) and r["longest"] == scorer.max_len
  line = suite_report.main_table({"tasks": {}, "zeroshot": {"blimp": r}, "zeroshot_average": 100 * r["overall"]})[1]
  assert f"{r['too_long']} longer than the model's {scorer.max_len} tokens, counted wrong" in line


def test_a_kept_result_of_an_older_checkpoint_is_scored_again(data, constant_workdir, tmp_path):
  """The kept BLiMP result names the checkpoint it scored: after more pretraining (a newer checkpoint) the
  same command scores again instead of printing the old model's accuracy as done."""
  from flax import nnx
  from mlm_jax.evaluation import fill_mask
  from mlm_jax.finetuning import suite
  from mlm_jax.workdir import checkpoints
  wd = tmp_path / "run"
  shutil.copytree(constant_workdir, wd)
  out, lines = str(tmp_path / "suite"), []
  first = suite.run_suite(str(wd), out, tasks="blimp", blimp_pairs=2, data=str(data), log=lines.append)
  assert first["zeroshot"]["blimp"]["depends_on"]["init_step"] == 1
  model = fill_mask.from_workdir(str(wd)).model
  model.decoder_bias[...] = model.decoder_bias[...].at[5].set(3.0)   # the pretraining "went on"
  ckpt = checkpoints.Checkpointer(str(wd), async_save=False)
  ckpt.save(2, {"params": nnx.state(model, nnx.Param)}, {})
  ckpt.close()
  lines.clear()
  again = suite.run_suite(str(wd), out, tasks="blimp", blimp_pairs=2, data=str(data), log=lines.append)
  assert not any("done before" in l for l in lines), lines
  assert any("blimp: the kept result is of another model or subset (init_step 1 -> 2)" in l for l in lines), lines
  assert again["zeroshot"]["blimp"]["depends_on"]["init_step"] == 2
  lines.clear()   # and a third run of the same command reads it back
  suite.run_suite(str(wd), out, tasks="blimp", blimp_pairs=2, data=str(data), log=lines.append)
  assert any("blimp: done before" in l for l in lines), lines


def test_baseline_prints_the_model_beside_its_random_init(data, constant_workdir, tmp_path):
  """`--baseline`: the same pairs scored for the model and for random weights of its architecture, one table
  with both and the gain (BLiMP per phenomenon, CLAMS per language); the header of a zero-shot-only run names
  no fine-tuning mode or seeds."""
  from mlm_jax.finetuning import suite
  out, lines = str(tmp_path / "suite"), []
  model, base = suite.run_with_baseline(constant_workdir, out, tasks="blimp,clams", blimp_pairs=2, data=str(data),
                                        log=lines.append)
  a, b = 100 * model["zeroshot"]["blimp"]["overall"], 100 * base["zeroshot"]["blimp"]["overall"]
  assert base["random_init"] and base["zeroshot"]["blimp"]["depends_on"]["random_init"]
  assert base["zeroshot"]["blimp"]["paradigms"] != model["zeroshot"]["blimp"]["paradigms"]
  table = open(os.path.join(out, "baseline.txt")).read()
  assert table.splitlines()[0] == f"downstream suite: {constant_workdir}  (zero-shot only)", table
  assert re.search(rf"^blimp +acc +{a:.1f} +{b:.1f} +{a - b:+.1f}$", table, re.M), table
  assert re.search(r"^  island_effects +acc +\d+\.\d +\d+\.\d +[+-]\d+\.\d$", table, re.M), table
  c, r = model["zeroshot"]["clams"]["groups"]["ru"], base["zeroshot"]["clams"]["groups"]["ru"]
  assert re.search(rf"^  clams/ru +acc +{100 * c:.1f} +{100 * r:.1f} +{100 * c - 100 * r:+.1f}$", table, re.M), table
  assert table.strip() == lines[-1].strip()


def test_bad_input_is_one_line(data, tmp_path, shared_data):
  from mlm_jax.finetuning import zeroshot_suite
  with pytest.raises(DataError, match=r"zeroshot/blimp: no such folder"):
    blimp.read(str(tmp_path / "zeroshot" / "blimp"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(DataError, match=r"empty: no \*\.jsonl\.gz paradigm files"):
    blimp.read(str(tmp_path / "empty"))
  bad = tmp_path / "bad"
  bad.mkdir()
  with gzip.open(bad / "x.jsonl.gz", "wt") as f:
    f.write(json.dumps(dict(sentence_good="A b.", sentence_bad="B a.", linguistics_term="t", UID="x")) + "\n")
    f.write('{"sentence_good": "A b.", "sentence_bad": \n')
  with pytest.raises(DataError, match=r"x\.jsonl\.gz:2: not a JSON object"):
    blimp.read(str(bad))
  with gzip.open(bad / "x.jsonl.gz", "wt") as f:
    f.write(json.dumps(dict(sentence_good="A b.", linguistics_term="t", UID="x")) + "\n")
  with pytest.raises(DataError, match=r"x\.jsonl\.gz:1: expected a JSON object with non-empty strings"):
    blimp.read(str(bad))
  # A transformers folder without an MLM head (a BertModel, as sentence-transformers saves): an error, not a
  # score. all-MiniLM-L6-v2's tokenizer files and a tiny random BertModel.
  transformers = pytest.importorskip("transformers")
  base = tmp_path / "base_model"
  transformers.BertModel(transformers.BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=32)).save_pretrained(base)
  for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
    shutil.copy(shared_data / "models" / "all-MiniLM-L6-v2" / name, base / name)
  from mlm_jax.tasks import catalogue
  with pytest.raises(NoMaskedLM, match=r"^blimp: .*base_model has no MLM head"):   # a UserError: one line
    zeroshot_suite.run_tasks(catalogue.select_zeroshot("blimp"), init_from=str(base), source=str(base),
                             out=str(tmp_path / "o"), fast=True, random_init=False, data=str(data), log=print,
                             identity={})


def test_the_cpu_recipes_variants_get_equal_compute():
  """configs/en_cpu_hour.py's variants (:mask30, :gptbert, ... and :short or :hour with them) train for as many
  steps as make steps x FLOPs per token (the objective's count, at the slots the masking predicts on CPU) the 15%
  run's of the same budget within one step; :gptbert's mask rate falls from 30% to 15% over exactly its steps;
  :hour and :timed train at the hour's learning rate."""
  import importlib.util
  from mlm_jax.objectives import masking, registry
  spec = importlib.util.spec_from_file_location("en_cpu_hour", pathlib.Path(__file__).resolve().parents[1]
                                                / "configs" / "en_cpu_hour.py")
  recipe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(recipe)

  def compute(variant):
    c = recipe.get_config(variant)
    c.model.vocab_size = c.tokenizer.vocab_size
    slots = masking.max_predictions(c.masking, c.data.seq_len, "cpu")
    return c.train.steps, registry.load(c.objective).flops_per_token(c, c.data.seq_len, slots)

  assert compute("hour")[0] == recipe.HOUR_STEPS and compute("short")[0] == recipe.STEPS // 4
  for budget in ("", "short,", "hour,"):
    s15, f15 = compute(budget.rstrip(","))
    for variant in ("mask30", "small", "gptbert", "lamb", "zloss", "ltg", "gptbert,lamb,zloss,ltg", "small,ltg"):
      s, f = compute(budget + variant)
      assert abs(s * f - s15 * f15) <= f, (budget, variant, s15, f15, s, f)
    s30, f30 = compute(budget + "mask30")
    assert f30 > f15 and s30 < s15
    assert (recipe.FLOPS_15, recipe.FLOPS_30) == pytest.approx((f15, f30), rel=1e-3)
  small = recipe.get_config("small,mask30,timed").model   # the shape measured on a CPU without bfloat16
  assert (small.num_layers, small.hidden_size, small.num_heads, small.intermediate_size) == (4, 128, 2, 512)
  gpt_bert = recipe.get_config("gptbert")
  assert tuple(gpt_bert.masking.mask_rate_schedule) == ("0:0.3", f"{gpt_bert.train.steps}:0.15")
  with pytest.raises(ValueError, match="mask30"):
    recipe.get_config("mask40")
  with pytest.raises(ValueError, match="two budgets"):
    recipe.get_config("short,hour")
  # :timed: the hour's warmup, 60 minutes of the clock, at most twice the hour's steps
  hour, timed = recipe.get_config("bf16,hour,mask30"), recipe.get_config("bf16,mask30,timed")
  assert timed.train.time_budget_minutes == 60.0 and hour.train.time_budget_minutes == 0.0
  assert (timed.train.steps, timed.optimizer.warmup_steps) == (2 * hour.train.steps, hour.optimizer.warmup_steps)
  # the hour's learning rate wherever the hour's budget runs, the recipe's elsewhere; LAMB keeps its own
  assert hour.optimizer.learning_rate == timed.optimizer.learning_rate == recipe.HOUR_LR
  assert recipe.get_config("bf16,short,mask30").optimizer.learning_rate == 1e-3 != recipe.HOUR_LR
  assert recipe.get_config("hour,lamb").optimizer.learning_rate == 1e-2
  assert timed.train.budget_calibration_steps < timed.optimizer.warmup_steps   # decided inside the warmup
  for bad in ("short,timed", "gptbert,timed"):
    with pytest.raises(ValueError, match="pick one"):
      recipe.get_config(bad)


def test_the_multilingual_recipes_languages_and_variants(shared_data):
  """configs/xlmr_cpu_hour.py: the word counts it samples languages by are those of its sources' files;
  :alpha=A draws p_i ∝ n_i^A; :hour fills the hour (its steps, its warmup); :mono=LANG trains for the steps
  that language gets in the multilingual run of the same length (its monolingual baseline at equal tokens);
  a wrong variant is one line naming it."""
  import gzip
  import importlib.util
  from mlm_jax.data import specs
  spec = importlib.util.spec_from_file_location("xlmr_cpu_hour", pathlib.Path(__file__).resolve().parents[1]
                                                / "configs" / "xlmr_cpu_hour.py")
  recipe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(recipe)
  for lang, (source, words) in recipe.LANGUAGES.items():
    s = specs.parse_spec(source)
    count = 0
    for path in specs.list_files(s.pattern):
      with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
          count += len((line.rstrip("\n").split("\t")[int(s.arg)] if s.kind == "tsv" else line).split())
    assert count == words, lang
  c = recipe.get_config("alpha=0.7")
  n = {lang: words for lang, (_, words) in recipe.LANGUAGES.items()}
  assert c.data.mix_alpha == 0.7 and c.data.source_sizes == tuple(f"{k}={v}" for k, v in n.items())
  shares = recipe.language_shares(0.7)
  assert shares["ru"] == pytest.approx(n["ru"] ** 0.7 / sum(v ** 0.7 for v in n.values()))
  for variant, steps in (("", recipe.STEPS), ("short,alpha=1", recipe.STEPS // 4), ("hour", recipe.HOUR_STEPS)):
    alpha = 1.0 if "alpha" in variant else recipe.ALPHA
    mono = [recipe.get_config(",".join(filter(None, (variant, f"mono={lang}")))) for lang in n]
    assert [m.data.sources for m in mono] == [(f"{lang}={recipe.LANGUAGES[lang][0]}",) for lang in n]
    assert [m.train.steps for m in mono] == [round(steps * recipe.language_shares(alpha)[lang]) for lang in n]
    assert abs(sum(m.train.steps for m in mono) - steps) <= 2
  assert recipe.get_config("f32").model.dtype == "float32" and recipe.get_config("").model.dtype == "bfloat16"
  hour = recipe.get_config("hour")
  assert (hour.train.steps, hour.optimizer.warmup_steps) == (recipe.HOUR_STEPS, recipe.HOUR_STEPS // 20)
  for bad in ("shortt", "mono=xx", "alpha=", "alpha=x", "short,hour"):
    with pytest.raises(ValueError, match=r"^configs/xlmr_cpu_hour.py:"):
      recipe.get_config(bad)
