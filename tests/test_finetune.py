"""Fine-tuning: readers, encodings, span decoding, and the loop on real data from a tiny imported HF model.

The loop tests run `finetuner.finetune` in the test process (8 fake CPU devices, so the batch and
the parameters are really sharded) on a 2-layer, 32-wide XLM-R made with transformers, saved with
`save_pretrained` and imported by the converter: a few steps each, seconds.
"""
import dataclasses
import gzip
import json
import re
import string
import os

import numpy as np
import pytest

from mlm_jax.tasks import features, qa, readers


@pytest.fixture(scope="module")
def tok(corpus_and_tokenizer):
  from mlm_jax.data.tokenizers import load as tokenizer_load
  return tokenizer_load.load(corpus_and_tokenizer[1])


# ------------------------------------------------------------------------------------------
# Readers
# ------------------------------------------------------------------------------------------
def test_table_formats(tmp_path):
  (tmp_path / "a.tsv").write_text("pos\tgood film\nneg\tbad\tplot\n\n")
  (tmp_path / "b.csv").write_text('sentence1,sentence2,label\n"Hi, there",Hello,1\n')
  (tmp_path / "c.jsonl").write_text('{"text": "x", "label": "neg"}\n\n{"text": "y", "label": "pos"}\n')
  with gzip.open(tmp_path / "pos.txt.gz", "wt") as f:
    f.write("great\n\nfun\n")
  t = readers.read_table([str(tmp_path / "a.tsv")], "tsv", "1", "0")
  assert [(e.text, e.label) for e in t] == [("good film", "pos"), ("bad", "neg")]
  c = readers.read_table([str(tmp_path / "b.csv")], "csv", "sentence1", "label", "sentence2", header=True)
  assert (c[0].text, c[0].text_b, c[0].label) == ("Hi, there", "Hello", "1")
  r = readers.read_table([str(tmp_path / "b.csv")], "csv", "sentence1", "label", header=True, regression=True)
  assert r[0].label == 1.0
  j = readers.read_table([str(tmp_path / "c.jsonl")], "jsonl", "text", "label")
  assert [e.label for e in j] == ["neg", "pos"]
  lines = readers.read_table([f"pos={tmp_path}/pos.txt.gz"], "lines", "", "")
  assert [(e.text, e.label) for e in lines] == [("great", "pos"), ("fun", "pos")]
  with pytest.raises(readers.DataError, match="no field 'txt'"):
    readers.read_table([str(tmp_path / "c.jsonl")], "jsonl", "txt", "label")
  with pytest.raises(readers.DataError, match="nothere"):
    readers.read_table([str(tmp_path / "nothere*.tsv")], "tsv", "1", "0")


def test_conll_reader_real_files(shared_data, tmp_path):
  d = shared_data / "downstream"
  uner = readers.read_conll([str(d / "ner_uner/en_ewt-ud-dev.iob2.gz")], token_column=1, tag_column=2)
  assert len(uner) == 2001   # SOURCES.md: en_ewt dev 2,001 sentences; '# text = ...' comments skipped
  assert uner[0].words[:3] == ["where", "can", "I"] and uner[0].tags[6:8] == ["B-LOC", "I-LOC"]
  wnut = readers.read_conll([str(d / "ner_wnut17/wnut17train.conll.gz")])
  assert len(wnut) == 3394   # separators that are a lone tab count as blank lines
  # A '#' token is data, a CoNLL-U comment is not.
  (tmp_path / "x.conll").write_text("# sent_id = 1\n#\tO\nParis\tB-LOC\n\t\nRome\tB-LOC\n")
  s = readers.read_conll([str(tmp_path / "x.conll")])
  assert [x.words for x in s] == [["#", "Paris"], ["Rome"]]


def test_squad_reader_checks_offsets(shared_data, tmp_path):
  ex = readers.read_squad([str(shared_data / "downstream/qa_xquad/xquad.en.json.gz")])
  assert len(ex) == 1190 and len({e.group for e in ex}) == 48
  bad = {"data": [{"title": "t", "paragraphs": [{"context": "abc def", "qas": [
      {"id": "q", "question": "?", "answers": [{"text": "def", "answer_start": 3}]}]}]}]}
  (tmp_path / "bad.json").write_text(json.dumps(bad))
  with pytest.raises(readers.DataError, match="answer_start=3"):
    readers.read_squad([str(tmp_path / "bad.json")])


# ------------------------------------------------------------------------------------------
# Encodings
# ------------------------------------------------------------------------------------------
def test_single_and_pair_layouts(tok):
  a, b = tok.encode("first text"), tok.encode("second")
  ex = [readers.Example(id="0", text="first text", text_b="second", label="y")]
  x = features.encode_classification(ex, tok, 16, ["n", "y"], type_vocab_size=1)
  n = len(a) + len(b) + 4
  assert list(x["input_ids"][0, :n]) == [tok.bos_id] + a + [tok.eos_id, tok.eos_id] + b + [tok.eos_id]
  assert list(x["segment_ids"][0]) == [1] * n + [0] * (16 - n)
  assert not x["token_type_ids"].any() and x["label"][0] == 1
  bert = dataclasses.replace(tok, layout="bert")
  y = features.encode_classification(ex, bert, 16, ["n", "y"], type_vocab_size=2)
  m = len(a) + len(b) + 3
  assert list(y["input_ids"][0, :m]) == [tok.bos_id] + a + [tok.eos_id] + b + [tok.eos_id]
  assert list(y["token_type_ids"][0, :m]) == [0] * (len(a) + 2) + [1] * (len(b) + 1)
  # Longest-first truncation keeps both segments.
  assert features.truncate_pair([1] * 10, [2] * 3, 8) == ([1] * 5, [2] * 3)
  with pytest.raises(readers.DataError, match="'maybe'"):
    features.encode_classification([dataclasses.replace(ex[0], label="maybe")], tok, 16, ["n", "y"], 1)


def test_labels_on_first_subtoken(tok):
  words = ["Unbelievably", "long", "Constantinople", "x"]
  ex = [readers.Example(id="s", words=words, tags=["O", "O", "B-LOC", "O"])]
  labels = ["O", "B-LOC", "I-LOC"]
  x, starts = features.encode_tokens(ex, tok, 64, labels)
  pieces = [tok.encode(w) for w in words]
  assert len(pieces[2]) > 1
  assert starts[0] == list(np.cumsum([1] + [len(p) for p in pieces[:-1]]))
  assert [int(v) for v in x["labels"][0][x["labels"][0] >= 0]] == [0, 0, 1, 0]
  assert (x["labels"][0] >= 0).sum() == len(words)
  logits = np.zeros((1, 64, 3))
  logits[0, starts[0][2], 1] = 5.0
  logits[0, starts[0][2] + 1, 2] = 9.0   # a later sub-token's opinion does not count
  assert features.decode_tokens(logits, starts, ex, labels) == [["O", "O", "B-LOC", "O"]]
  # Words that do not fit are predicted O, so the gold entity still counts.
  short, cut = features.encode_tokens(ex, tok, 1 + len(pieces[0]) + len(pieces[1]) + 1, labels)
  assert len(cut[0]) == 2
  assert features.decode_tokens(np.zeros((1, short["labels"].shape[1], 3)), cut, ex, labels)[0] == ["O"] * 4


# ------------------------------------------------------------------------------------------
# QA
# ------------------------------------------------------------------------------------------
def test_best_span_is_valid_and_optimal():
  rng = np.random.default_rng(0)
  for trial in range(300):
    n = int(rng.integers(1, 24))
    start, end = rng.normal(size=n) * 3, rng.normal(size=n) * 3
    valid = rng.random(n) < 0.7
    limit = int(rng.integers(1, 6))
    got = qa.best_span(start, end, valid, limit)
    pairs = [(i, j) for i in range(n) for j in range(n) if valid[i] and valid[j] and 0 <= j - i < limit]
    if not pairs:
      assert got is None
      continue
    i, j, score = got
    assert valid[i] and valid[j] and i <= j and j - i + 1 <= limit
    assert score == pytest.approx(max(start[a] + end[b] for a, b in pairs))
  # An end logit peaking before the start, and a long span, are never chosen.
  s = np.array([-1., 9., 0., 0., 0.])
  e = np.array([9., 0., 0., 0., 8.])
  assert qa.best_span(s, e, np.ones(5, bool), 2)[:2] in [(1, 1), (1, 2)]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_qa_windows_and_offsets_round_trip(shared_data, tok, lang):
  """Oracle logits on the gold pieces give back the gold answers (exact slices of the paragraph),
  also for Chinese, whose characters are byte-fallback pieces for this English tokenizer."""
  from mlm_jax.tasks import metrics as task_metrics
  ex = readers.read_squad([str(shared_data / f"downstream/qa_xquad/xquad.{lang}.json.gz")])[:40]
  arrays, feats = qa.encode(ex, tok, 96, type_vocab_size=1, max_query_length=24, doc_stride=32)
  assert len(feats) > len(ex)      # long paragraphs span several windows
  start = np.full(arrays["input_ids"].shape, -10.0)
  end = np.full(arrays["input_ids"].shape, -10.0)
  for r in range(len(feats)):
    s, e = arrays["start_position"][r], arrays["end_position"][r]
    assert (s == 0) == (e == 0) and s <= e
    if s:
      assert s in feats[r].char_spans and e in feats[r].char_spans
      start[r, s], end[r, e] = 10.0, 10.0
  pred = qa.decode(start, end, feats, ex, max_answer_length=64)
  scores = task_metrics.squad({e.id: [a["text"] for a in e.answers] for e in ex}, pred)
  assert scores["f1"] > 0.95, scores
  assert all(pred[e.id] in e.context for e in ex)


# ------------------------------------------------------------------------------------------
# The loop, from a transformers folder
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, tok):
  """A tiny random XLM-R saved by transformers, with our sentencepiece model as its tokenizer."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from mlm_jax.convert import tokenizer_files
  torch.manual_seed(0)
  conf = transformers.XLMRobertaConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, intermediate_size=64, max_position_embeddings=66,
                                       type_vocab_size=1, pad_token_id=tok.pad_id, bos_token_id=tok.bos_id,
                                       eos_token_id=tok.eos_id, layer_norm_eps=1e-5)
  path = tmp_path_factory.mktemp("hf") / "tiny-xlmr"
  transformers.XLMRobertaForMaskedLM(conf).save_pretrained(str(path))
  tokenizer_files.write(tok, str(path), 64)
  return str(path)


def _config(kind, **task):
  from mlm_jax.config.finetune_defaults import finetune_config
  c = finetune_config()
  c.task.kind = kind
  c.task.update(task)
  c.seq_len = 64
  c.optimizer.update(dict(learning_rate=1e-3, warmup_fraction=0.0))
  c.train.update(dict(steps=12, batch_size=16, eval_batch_size=32, log_every=1, eval_every=6, save_every=6))
  return c


def _lines(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(l) for l in f]


def test_classification_from_hf_folder(hf_folder, shared_data, tmp_path):
  from mlm_jax.finetuning import finetuner
  c = _config("classification", train_files=(str(shared_data / "downstream/sms_spam/SMSSpamCollection.tsv"),),
              text_field="1", label_field="0", max_train_examples=400, max_eval_examples=64)
  wd = tmp_path / "run"
  result = finetuner.finetune(c, str(wd), init_from=hf_folder)
  assert os.path.exists(wd / "init_model" / "checkpoints" / "0")      # converted once by from_hf
  losses = [l["loss"] for l in _lines(wd) if "loss" in l]
  assert len(losses) == 12 and all(np.isfinite(losses))
  assert np.mean(losses[-4:]) < np.mean(losses[:4]), losses
  evals = [l for l in _lines(wd) if "eval_accuracy" in l]
  assert [l["step"] for l in evals] == [6, 12] and all("eval_macro_f1" in l for l in evals)
  assert result["best_step"] in (6, 12) and result["best_metric"] == "accuracy"
  assert result["eval_accuracy"] == max(l["eval_accuracy"] for l in evals)
  preds = [json.loads(l) for l in open(wd / "predictions.jsonl")]
  assert len(preds) == 64 and {p["prediction"] for p in preds} <= {"ham", "spam"}
  assert os.listdir(wd / "best" / "checkpoints") == [str(result["best_step"])]

  # Re-running the finished command resumes at the end: nothing is trained twice.
  again = finetuner.finetune(c, str(wd), init_from=hf_folder)
  assert len([l for l in _lines(wd) if "loss" in l]) == 12 and again["best_step"] == result["best_step"]


def test_ner_and_qa_from_converted_folder(hf_folder, shared_data, tmp_path):
  from mlm_jax.finetuning import finetuner
  d = shared_data / "downstream"
  ner = _config("token", train_files=(str(d / "ner_uner/en_ewt-ud-dev.iob2.gz"),),
                eval_files=(str(d / "ner_uner/en_ewt-ud-test.iob2.gz"),), token_column=1, tag_column=2,
                max_train_examples=200, max_eval_examples=50)
  ner.train.update(dict(steps=4, eval_every=4, profile_steps=(2, 2)))   # fine-tuning profiles as pretraining does
  r = finetuner.finetune(ner, str(tmp_path / "ner"), init_from=hf_folder)
  assert 0.0 <= r["eval_f1"] <= 1.0 and "eval_token_accuracy" in r
  from mlm_jax.training import trace_summary
  profile = trace_summary.summarize(trace_summary.find_traces(str(tmp_path / "ner"))[0])
  assert [s["step"] for s in profile["steps"]] == [2, 3] and profile["ops"], profile["steps"]
  seconds = json.loads((tmp_path / "ner" / "goodput.json").read_text())["segments"][0]["seconds"]
  assert seconds["step"] > 0 and seconds["eval"] > 0 and seconds["compile"] > 0
  text = (tmp_path / "ner" / "predictions.conll").read_text().strip().split("\n\n")
  assert len(text) == 50 and all(len(line.split()) == 3 for s in text for line in s.splitlines())
  rows = [line.split() for s in text for line in s.splitlines()]
  # the reported token accuracy is the predictions file's (gold and predicted tag per word), counted here
  assert r["eval_token_accuracy"] == pytest.approx(sum(g == p for _, g, p in rows) / len(rows))
  # The from_hf folder written for the first run is itself a valid init_from.
  squad = _config("qa", train_files=(str(d / "qa_xquad/xquad.en.json.gz"),), eval_percent=10.0,
                  max_query_length=16, doc_stride=24, max_train_examples=64, max_eval_examples=16)
  squad.train.update(dict(steps=4, eval_every=4))
  r = finetuner.finetune(squad, str(tmp_path / "qa"), init_from=str(tmp_path / "ner" / "init_model"))
  assert {"eval_exact_match", "eval_f1"} <= set(r)
  answers = json.loads((tmp_path / "qa" / "predictions.json").read_text())
  assert len(answers) == 16 and all(len(a.split()) <= 30 for a in answers.values())
  # each answer is a span of its own paragraph, and the reported exact match is the file's, counted here
  by_id = {e.id: e for e in readers.read_squad([str(d / "qa_xquad/xquad.en.json.gz")])}
  assert all(a in by_id[q].context for q, a in answers.items())
  norm = lambda t: " ".join(re.sub(r"\b(a|an|the)\b", " ", "".join(
      c for c in t.lower() if c not in string.punctuation)).split())
  em = [max(norm(a) == norm(g["text"]) for g in by_id[q].answers) for q, a in answers.items()]
  assert r["eval_exact_match"] == pytest.approx(sum(em) / len(em))
