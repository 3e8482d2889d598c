"""WordPiece and byte-level BPE tokenizers (mlm_jax/data/tokenizers/hf_tokenizers.py) through every consumer.

Real files: all-MiniLM-L6-v2's WordPiece tokenizer (shared/data/models, uncased BERT), and a
byte-level BPE RoBERTa folder trained here with `tokenizers` on shared corpus lines. Every check
compares with transformers' AutoTokenizer on the same folder, or with what the tokenizer's own
pre-tokenizer says a word is. tools/tokenizer_parity.py runs the id comparison on every corpus line.
"""
import os
import shutil

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from mlm_jax.config import defaults  # noqa: E402
from mlm_jax.data.store import text_reader  # noqa: E402
from mlm_jax.data.tokenizers import hf_tokenizers  # noqa: E402
from mlm_jax.data.tokenizers import load as tokenizer_load  # noqa: E402

EN = "corpus/en/leipzig/eng_news-typical_2016_10K-sentences.txt.gz"
PER_FILE, PER_LANG = 40, 120


def _lines(path, n):
  out, counters = [], text_reader.Counters()
  for doc in text_reader.documents(str(path), -1, "line", 1 << 16, counters):
    out.append(doc[0])
    if len(out) >= n:
      break
  return out


@pytest.fixture(scope="module")
def lines_by_lang(shared_data):
  """Up to PER_LANG lines of every language folder, PER_FILE from each file, as the text reader yields them."""
  out = {}
  for d in sorted((shared_data / "corpus").iterdir()):
    files = sorted(p for p in d.rglob("*") if p.is_file() and p.suffix != ".md" and "README" not in p.name)
    lines = []
    for f in files[:PER_LANG // PER_FILE]:
      lines += _lines(f, PER_FILE)
    out[d.name] = lines
  return out


@pytest.fixture(scope="module")
def wp_dir(shared_data):
  return str(shared_data / "models" / "all-MiniLM-L6-v2")


@pytest.fixture(scope="module")
def bpe_dir(lines_by_lang, tmp_path_factory):
  root = tmp_path_factory.mktemp("roberta_bpe")
  hf_tokenizers.train_bpe([l for ls in lines_by_lang.values() for l in ls], str(root), 2000)
  return str(root)


@pytest.fixture(scope="module")
def hf_folders(wp_dir, bpe_dir, tmp_path_factory):
  vocab_only = tmp_path_factory.mktemp("bert_vocab_txt")
  for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
    shutil.copy(os.path.join(wp_dir, name), vocab_only / name)
  merges_only = tmp_path_factory.mktemp("roberta_vocab_json")
  for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"):
    shutil.copy(os.path.join(bpe_dir, name), merges_only / name)
  return dict(wordpiece=wp_dir, wordpiece_vocab_txt=str(vocab_only), bpe=bpe_dir, bpe_vocab_json=str(merges_only))


def _hf(folder):
  return transformers.AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("kind", ["wordpiece", "wordpiece_vocab_txt", "bpe", "bpe_vocab_json"])
def test_ids_equal_autotokenizer_every_language(hf_folders, lines_by_lang, kind):
  tok, hf = tokenizer_load.load(hf_folders[kind]), _hf(hf_folders[kind])
  assert tok.family == kind.split("_")[0]
  assert tok.layout == ("bert" if kind.startswith("wordpiece") else "xlmr")
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id, tok.mask_id) == (
      hf.cls_token_id, hf.sep_token_id, hf.pad_token_id, hf.unk_token_id, hf.mask_token_id)
  assert tok.vocab_size == len(hf)
  assert len(lines_by_lang) >= 14
  for lang, lines in lines_by_lang.items():
    assert len(lines) >= PER_FILE, lang
    theirs = hf(lines)["input_ids"]
    for line, ours, want in zip(lines, tok.encode_batch(lines), theirs):
      assert [tok.bos_id] + ours + [tok.eos_id] == want, (kind, lang, line)
  # Pairs: BERT joins with one [SEP] and token types, RoBERTa with </s></s>.
  from mlm_jax.tasks import features
  from mlm_jax.tasks.readers import Example
  en = lines_by_lang["en"][:8]
  ex = [Example(id=str(i), text=a, text_b=b, label="x") for i, (a, b) in enumerate(zip(en[::2], en[1::2]))]
  got = features.encode_classification(ex, tok, 256, ["x"], 2 if tok.layout == "bert" else 1)
  want = hf([e.text for e in ex], [e.text_b for e in ex])
  for row in range(len(ex)):
    n = int(got["segment_ids"][row].sum())
    assert got["input_ids"][row, :n].tolist() == want["input_ids"][row]
    if tok.layout == "bert":
      assert got["token_type_ids"][row, :n].tolist() == want["token_type_ids"][row]


def _word_count(tok, line):
  """Words as the family's own pre-tokenizer sees them (independent of the '##' / 'Ġ' piece spelling)."""
  if tok.family == "wordpiece":
    return len(tok.backend.pre_tokenizer.pre_tokenize_str(tok.backend.normalizer.normalize_str(line)))
  return len(line.split())   # byte-level BPE: a run of non-spaces (leipzig lines hold a tab)


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_word_starts_count_the_words(hf_folders, lines_by_lang, kind):
  tok = tokenizer_load.load(hf_folders[kind])
  table = np.asarray(tok.word_start_table())
  after = np.asarray(tok.after_space_table() or np.zeros(tok.vocab_size, int))
  assert table[list(tok.special_ids)].all() and (tok.family == "bpe") == bool(after.any())
  checked = 0
  for lang, lines in lines_by_lang.items():
    for line, ids in zip(lines, tok.encode_batch(lines)):
      # Not counted: double spaces (a whitespace-only piece), and non-ASCII spaces (U+00A0...), whose
      # UTF-8 bytes a small BPE vocabulary may leave as separate byte pieces, neither of them whitespace.
      if "  " in line or line != line.lstrip() or any(c.isspace() and c not in " \t" for c in line) or not ids:
        continue
      starts = table[ids].copy()
      starts[1:] |= after[ids[:-1]]   # after a piece ending in whitespace ('ĉ', an unmerged 'Ġ')
      starts[0] = 1   # the first piece of a line starts a word (RoBERTa's has no 'Ġ')
      assert starts.sum() == _word_count(tok, line), (kind, lang, line, [tok.id_to_piece(i) for i in ids])
      checked += 1
  assert checked > 800


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_streaming_batch_ids_and_whole_word_masking(shared_data, hf_folders, kind):
  """One streaming-pipeline batch: AutoTokenizer's ids packed as documents, word starts, whole-word masks."""
  import jax
  from mlm_jax.objectives import masking
  from mlm_jax.data.text import stream
  from mlm_jax.config.defaults import masking_defaults
  tok, hf = tokenizer_load.load(hf_folders[kind]), _hf(hf_folders[kind])
  c = defaults.data_defaults()
  # Next-fit packing keeps the documents in file order across the rows, which is what `want` spells out.
  c.update(dict(sources=(f"en=tsv:1:{shared_data / EN}",), doc_format="line", seq_len=64, eval_percent=0.0,
                shuffle_buffer=0, shuffle_files=False, tokenize_batch=64, packing_fit="next"))
  batch = next(stream.build_dataset(c, tok, batch_size=16, seed=0, repeat=False).as_numpy_iterator())
  lines = [l.split("\t")[1] for l in _lines(shared_data / EN, 200)]
  want, want_ws = [], []
  for ids in hf(lines, add_special_tokens=False)["input_ids"]:
    for k in range(0, len(ids), 62):
      chunk = ids[k:k + 62]
      want += [tok.bos_id] + chunk + [tok.eos_id]
      words = np.cumsum([int(not tok.id_to_piece(i).startswith("##")) if kind == "wordpiece" else 0
                         for i in chunk])
      if kind == "bpe":   # a new word where the decoded text has whitespace before a non-space
        text = [hf.decode([i]) for i in chunk]
        words = [int(j == 0 or (t[:1].isspace() and not t.isspace()) or text[j - 1][-1:].isspace())
                 for j, t in enumerate(text)]
      else:
        words = [1] + [int(not tok.id_to_piece(i).startswith("##")) for i in chunk[1:]]
      want_ws += [1] + words + [1]
  real = batch["segment_ids"] > 0
  got = batch["input_ids"][real].tolist()
  assert len(got) > 500 and got == want[:len(got)]
  assert batch["word_starts"][real].tolist() == want_ws[:len(got)]
  # Whole-word masking never splits one of these words, and masks multi-piece words whole.
  cfg = masking_defaults()
  cfg.update(dict(mode="whole_word", mask_id=tok.mask_id,
                  special_ids=tuple(i for i in tok.special_ids if i != tok.mask_id)))
  out = jax.jit(lambda b, k: masking.mask_batch(b, k, cfg, tok.vocab_size))(
      {k: v for k, v in batch.items()}, jax.random.key(0))
  sel = np.zeros(batch["input_ids"].shape, bool)
  w = np.asarray(out["masked_weights"]) > 0
  for i in range(sel.shape[0]):
    sel[i, np.asarray(out["masked_positions"])[i][w[i]]] = True
  multi = 0
  for i in range(sel.shape[0]):
    special = np.isin(batch["input_ids"][i], tok.special_ids) | ~real[i]
    word = np.cumsum((batch["word_starts"][i] > 0) | special)
    for wid in np.unique(word[sel[i]]):
      assert sel[i][word == wid].all(), (kind, i, wid)
      multi += (word == wid).sum() > 1
  assert sel.sum() > 50 and multi > 3


def test_store_with_wordpiece(shared_data, hf_folders, tmp_path):
  """prepare copies the tokenizer files into the store; a `store:` source trains with them."""
  from mlm_jax.data.store import loader
  from mlm_jax.data.store import prepare
  tok, hf = tokenizer_load.load(hf_folders["wordpiece"]), _hf(hf_folders["wordpiece"])
  src = tmp_path / "en.txt"
  lines = [l.split("\t")[1] for l in _lines(shared_data / EN, 300)]
  src.write_text("\n".join(lines) + "\n", encoding="utf-8")
  root = str(tmp_path / "store")
  opts = prepare.Options(sources=(f"en={src}",), tokenizer=hf_folders["wordpiece"], eval_percent=0.0)
  manifest = prepare.prepare(opts, root, progress_s=1e9, log=lambda s: None)
  t = manifest["tokenizer"]
  assert t["family"] == "wordpiece" and t["model"] == "tokenizer/tokenizer.json" and t["sha256"] == tok.sha256
  assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= set(t["files"])
  c = defaults.data_defaults()
  c.update(dict(sources=(f"store:{root}",), seq_len=64))
  path = loader.store_tokenizer_path(c)
  again = tokenizer_load.load(path)
  assert again.sha256 == tok.sha256 and again.family == "wordpiece" and again.mask_id == tok.mask_id
  # The documents read back are AutoTokenizer's ids of the lines (word starts: no '##').
  want = {tuple(ids) for ids in hf(lines)["input_ids"]}
  batch = next(iter(loader.StorePipeline(c, 8, seed=0, cache_dir=str(tmp_path / "index"))))
  docs = 0
  for i in range(8):
    ids, seg, ws = batch["input_ids"][i], batch["segment_ids"][i], batch["word_starts"][i]
    for s in np.unique(seg[seg > 0]):
      d = ids[seg == s].tolist()
      if d[0] == tok.bos_id and d[-1] == tok.eos_id and len(d) < 64:
        assert tuple(d) in want
        assert ws[seg == s].tolist() == [1] + [int(not tok.id_to_piece(x).startswith("##")) for x in d[1:-1]] + [1]
        docs += 1
  assert docs >= 8


def test_ner_words_and_qa_offsets(hf_folders, lines_by_lang):
  from mlm_jax.tasks import features, qa
  from mlm_jax.tasks.readers import Example
  for kind in ("wordpiece", "bpe"):
    tok = tokenizer_load.load(hf_folders[kind])
    lines = [l for l in lines_by_lang["en"] + lines_by_lang["de"] if "  " not in l.strip() and len(l) < 300][:30]
    # NER: the words' pieces are the sentence's pieces (BPE words after the first carry their space).
    ex = [Example(id=str(i), words=l.split(), tags=["O"] * len(l.split())) for i, l in enumerate(lines)]
    arrays, starts = features.encode_tokens(ex, tok, 512, ["O"])
    for row, (e, line) in enumerate(zip(ex, lines)):
      n = int(arrays["segment_ids"][row].sum())
      assert arrays["input_ids"][row, :n].tolist() == [tok.bos_id] + tok.encode(" ".join(e.words)) + [tok.eos_id]
      assert len(starts[row]) == len(e.words)
    # QA: an answer located through the offsets comes back as the exact characters of the paragraph.
    found = 0
    for i, context in enumerate(lines):
      word = max(context.split(), key=len).strip(".,;:!?()\"'")
      start = context.find(word)
      e = Example(id=str(i), text="What is it?", context=context, answers=[dict(text=word, answer_start=start)])
      arrays, feats = qa.encode([e], tok, 384, 2 if tok.layout == "bert" else 1)
      s, t = int(arrays["start_position"][0]), int(arrays["end_position"][0])
      assert 0 < s <= t
      first, last = feats[0].char_spans[s][0], feats[0].char_spans[t][1]
      assert word in context[first:last] and len(context[first:last].strip()) <= len(word) + 2, (kind, word)
      found += 1
    assert found == len(lines)


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_hf_round_trip_keeps_tokenizer_files(hf_folders, lines_by_lang, tmp_path, kind):
  """from_hf copies the folder's tokenizer; to_hf writes it back: AutoTokenizer and fill-mask agree with ours."""
  torch = pytest.importorskip("torch")
  from mlm_jax.evaluation import fill_mask
  from mlm_jax.convert import folders
  tok = tokenizer_load.load(hf_folders[kind])
  torch.manual_seed(0)
  small = dict(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=48, max_position_embeddings=80)
  if kind == "wordpiece":
    model = transformers.BertForMaskedLM(transformers.BertConfig(**small, type_vocab_size=2, pad_token_id=tok.pad_id))
  else:
    model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(
        **small, type_vocab_size=1, pad_token_id=tok.pad_id, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id))
  src = tmp_path / "hf"
  model.eval().save_pretrained(str(src))
  folders.write_tokenizer_files(tok, str(src))
  summary = folders.from_hf(str(src), str(tmp_path / "ours"))
  assert summary["tokenizer"] == str(tmp_path / "ours" / "tokenizer" / "tokenizer.json")
  assert tokenizer_load.load(summary["tokenizer"]).sha256 == tok.sha256
  out = tmp_path / "exported"
  files = folders.to_hf(str(tmp_path / "ours"), str(out))["files"]
  assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= set(files)
  assert set(tok.files()) <= set(files) and ("vocab.txt" in files) == (kind == "wordpiece")   # every original
  hf = transformers.AutoTokenizer.from_pretrained(str(out))
  lines = lines_by_lang["en"][:20] + lines_by_lang["ru"][:20]
  assert hf(lines)["input_ids"] == [[tok.bos_id] + ids + [tok.eos_id] for ids in tok.encode_batch(lines)]
  fill = transformers.pipeline("fill-mask", model=str(out), tokenizer=str(out), top_k=5, device="cpu")
  lm = fill_mask.from_workdir(str(tmp_path / "ours"))
  from_folder = fill_mask.from_hf_dir(str(out))   # tools/fill_mask.py --hf_dir: the folder's own tokenizer
  assert from_folder.tokenizer.sha256 == tok.sha256
  for n, text in enumerate((f"The capital of France is {tok.mask_token}.",
                            f"{tok.mask_token} was not here, said the {tok.mask_token}")):
    ours = fill_mask.fill_mask(lm, text, 5)
    theirs = fill(text)
    theirs = [theirs] if isinstance(theirs[0], dict) else theirs
    assert ours["ids"] == hf(text)["input_ids"]
    if n == 0:
      again = fill_mask.fill_mask(from_folder, text, 5)
      assert [[p["id"] for p in m["predictions"]] for m in again["masks"]] == \
          [[p["id"] for p in m["predictions"]] for m in ours["masks"]]
    for m, t in zip(ours["masks"], theirs):
      assert [p["id"] for p in m["predictions"]] == [p["token"] for p in t], (kind, text)
      np.testing.assert_allclose([p["probability"] for p in m["predictions"]], [p["score"] for p in t], rtol=1e-4)


def test_store_and_streaming_give_the_same_bpe_ids_for_multi_line_documents(shared_data, hf_folders, tmp_path):
  """Byte-level BPE: prepare encodes a paragraph's later lines as ' ' + line, as the streaming path
  sees them (lines joined with spaces), so both paths give the same ids; pinned in prepare.json."""
  import json
  from mlm_jax.data.store import shards, prepare
  from mlm_jax.data.text import stream
  tok = tokenizer_load.load(hf_folders["bpe"])
  lines = [l.split("\t")[1] for l in _lines(shared_data / EN, 40)]
  paragraphs = ["\n".join(lines[i:i + 3]) for i in range(0, 30, 3)]
  src = tmp_path / "en.txt"
  src.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
  root = str(tmp_path / "store")
  opts = prepare.Options(sources=(f"en={src}",), tokenizer=hf_folders["bpe"], doc_format="blank_line", eval_percent=0.0)
  prepare.prepare(opts, root, progress_s=1e9, log=lambda s: None)
  assert json.loads((tmp_path / "store" / "prepare.json").read_text())["later_lines"] == "space_prefixed"
  st = shards.Store(root)
  stored = [d.ids.tolist() for d in st.read("en", "train", np.arange(st.lengths("en", "train").size))]
  c = defaults.data_defaults()
  c.update(dict(sources=(f"en={src}",), doc_format="blank_line", seq_len=512, eval_percent=0.0,
                shuffle_buffer=0, shuffle_files=False))
  streamed = []
  for b in stream.build_dataset(c, tok, 4, 0, repeat=False).as_numpy_iterator():
    for ids, seg in zip(b["input_ids"], b["segment_ids"]):
      streamed += [ids[seg == s][1:-1].tolist() for s in np.unique(seg[seg > 0])]
  assert len(stored) == 10 and sorted(stored) == sorted(streamed)
  joined = [tok.encode(" ".join(p.split("\n"))) for p in paragraphs]
  assert sorted(joined) == sorted(stored)
