"""Downstream metrics against hand-worked examples: conlleval chunking and SQuAD v1.1 normalization.

Every expected number below was worked out by hand from the rules of the reference scripts
(conlleval.pl's startOfChunk / endOfChunk; SQuAD v1.1's evaluate-v1.1.py), not by running the code.
"""
import pytest

from mlm_jax.tasks import metrics as task_metrics


# ------------------------------------------------------------------------------------------
# Classification
# ------------------------------------------------------------------------------------------
def test_accuracy_and_macro_f1():
  gold = ["a", "a", "a", "b", "b", "c"]
  pred = ["a", "a", "b", "b", "c", "c"]
  assert task_metrics.accuracy(gold, pred) == pytest.approx(4 / 6)
  # a: tp 2 fp 0 fn 1 -> 4/5; b: tp 1 fp 1 fn 1 -> 1/2; c: tp 1 fp 1 fn 0 -> 2/3
  assert task_metrics.macro_f1(gold, pred) == pytest.approx((4 / 5 + 1 / 2 + 2 / 3) / 3)
  # A class only ever predicted (never gold) counts, with F1 0.
  assert task_metrics.macro_f1(["x", "x"], ["x", "y"]) == pytest.approx((2 / 3 + 0) / 2)
  with pytest.raises(ValueError):
    task_metrics.accuracy(["a"], [])


# ------------------------------------------------------------------------------------------
# conlleval
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tags, expected", [
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
    # IOB1: an I- after O (or at the sentence start) opens a chunk.
    (["I-PER", "I-PER", "O", "I-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
    # B- after B- of the same type: two chunks.
    (["B-ORG", "B-ORG"], [("ORG", 0, 0), ("ORG", 1, 1)]),
    # A type change ends the chunk even without a B-.
    (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 2)]),
    (["I-PER", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 1)]),
    # B- inside an I- run of the same type splits it.
    (["B-PER", "I-PER", "B-PER", "I-PER"], [("PER", 0, 1), ("PER", 2, 3)]),
    # A chunk running to the end of the sentence is closed by the boundary.
    (["O", "O", "B-MISC", "I-MISC"], [("MISC", 2, 3)]),
    (["O", "O"], []),
])
def test_chunks(tags, expected):
  assert task_metrics.chunks(tags) == expected


def test_conlleval_hand_worked():
  gold = [["B-PER", "I-PER", "O", "B-LOC"],
          ["B-PER", "I-PER", "I-PER"],
          ["B-ORG", "O", "B-LOC", "I-LOC"]]
  pred = [["B-PER", "I-PER", "O", "B-ORG"],     # PER right, LOC labeled ORG
          ["B-PER", "I-PER", "B-PER"],          # one gold chunk split in two: nothing right
          ["I-ORG", "O", "I-LOC", "I-LOC"]]     # IOB1-style tags, same chunks: both right
  r = task_metrics.conlleval(gold, pred)
  # gold chunks 2 + 1 + 2 = 5, predicted 2 + 2 + 2 = 6, correct 1 + 0 + 2 = 3
  assert r["precision"] == pytest.approx(3 / 6)
  assert r["recall"] == pytest.approx(3 / 5)
  assert r["f1"] == pytest.approx(2 * 0.5 * 0.6 / 1.1)
  assert r["accuracy"] == pytest.approx(7 / 11)   # token accuracy: 3 + 2 + 2 of 11 tags
  per = r["per_type"]
  assert (per["PER"]["precision"], per["PER"]["recall"], per["PER"]["support"]) == pytest.approx((1 / 3, 1 / 2, 2))
  assert per["LOC"]["f1"] == pytest.approx(2 / 3)    # P 1/1, R 1/2
  assert per["ORG"]["f1"] == pytest.approx(2 / 3)    # P 1/2, R 1/1


def test_pos_reports_token_accuracy_only_entity_tags_keep_chunk_f1(shared_data):
  """UD PUD's UPOS tags are no chunk tags: the POS task (real files, round 2's tokenizer) reports token
  accuracy alone, and picks it as its metric (conlleval would read NOUN VERB as IOB1 chunks and report
  an entity F1); UNER's BIO tags keep conlleval's F1."""
  import pathlib
  import numpy as np
  from mlm_jax.data.tokenizers import load as tokenizer_load
  from mlm_jax.tasks import catalogue, readers, task as task_lib
  tok = tokenizer_load.load(str(pathlib.Path(__file__).parent / "fixtures/round2/store/tokenizer/spm.model"))
  config = catalogue.load_config(catalogue.BY_NAME["pos"], "fast", str(shared_data))
  config.task.update(max_train_examples=20, max_eval_examples=40)
  pos = task_lib.build(config.task, tok, 512, 1)
  assert {"NOUN", "VERB", "DET"} <= set(pos.labels) and not pos.chunk_tags
  assert pos.default_metric == "token_accuracy"
  words = sum(len(e.words) for e in pos.eval_examples)
  assert sum(len(m) for m in pos.eval_meta) == words          # every word fits in 512 pieces
  logits = np.zeros(pos.eval["input_ids"].shape + (pos.num_labels,), np.float32)
  logits[..., pos.labels.index("NOUN")] = 1.0                   # every word a noun
  nouns = sum(t == "NOUN" for e in pos.eval_examples for t in e.tags)
  assert pos.score(logits)[0] == {"token_accuracy": pytest.approx(nouns / words)}
  uner = sorted((shared_data / "downstream" / "ner_uner").glob("en_pud*"))[0]
  tags = sorted({t for e in readers.read_conll([str(uner)], token_column=1, tag_column=2) for t in e.tags})
  assert "B-PER" in tags and task_metrics.is_chunk_tagset(tags)
  assert not task_metrics.is_chunk_tagset(["NOUN", "O"]) and not task_metrics.is_chunk_tagset([])


def test_conlleval_chunks_do_not_cross_sentences():
  # A sentence-final B-PER and a sentence-initial I-PER are two chunks, as in conlleval (blank line = O).
  r = task_metrics.conlleval([["O", "B-PER"], ["I-PER", "O"]], [["O", "B-PER"], ["I-PER", "O"]])
  assert r["f1"] == 1.0 and r["per_type"]["PER"]["support"] == 2
  merged = task_metrics.conlleval([["O", "B-PER", "I-PER", "O"]], [["O", "B-PER", "I-PER", "O"]])
  assert merged["per_type"]["PER"]["support"] == 1


def test_conlleval_boundary_errors_score_zero():
  # Too long, too short and shifted spans are all wrong: only exact span + type counts.
  gold = [["B-LOC", "I-LOC", "O", "O"]] * 3
  pred = [["B-LOC", "I-LOC", "I-LOC", "O"], ["B-LOC", "O", "O", "O"], ["O", "B-LOC", "I-LOC", "O"]]
  r = task_metrics.conlleval(gold, pred)
  assert (r["precision"], r["recall"], r["f1"]) == (0.0, 0.0, 0.0)
  with pytest.raises(ValueError):
    task_metrics.conlleval([["O"]], [["O", "O"]])


# ------------------------------------------------------------------------------------------
# SQuAD v1.1
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("The  Quick, brown fox!", "quick brown fox"),
    ("an apple a day", "apple day"),
    ("Theatre of the Absurd", "theatre of absurd"),   # 'the' only as a whole word
    ("U.S.A.", "usa"),
    ("A-team", "ateam"),                              # punctuation goes before the articles
    ("  «Paris» \n", "«paris»"),                      # only ASCII punctuation is removed
])
def test_normalize_answer(text, expected):
  assert task_metrics.normalize_answer(text) == expected


def test_squad_em_f1():
  assert task_metrics.exact_match("the Eiffel Tower", "Eiffel  tower.") == 1.0
  assert task_metrics.token_f1("Eiffel Tower in Paris", "the Eiffel Tower") == pytest.approx(2 / 3)   # P 2/4, R 2/2
  assert task_metrics.token_f1("the cat cat", "a cat") == pytest.approx(2 / 3)                         # overlap counted once
  assert task_metrics.token_f1("dog", "cat") == 0.0
  assert task_metrics.token_f1("the", "a") == 0.0        # both normalize to nothing: 0, as the official script
  gold = {"q1": ["Denver Broncos", "The Denver Broncos"], "q2": ["Eiffel Tower"], "q3": ["1990"]}
  pred = {"q1": "the Denver Broncos", "q2": "Eiffel Tower in Paris"}   # q3 unanswered: 0
  r = task_metrics.squad(gold, pred)
  assert r["exact_match"] == pytest.approx(1 / 3)
  assert r["f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
