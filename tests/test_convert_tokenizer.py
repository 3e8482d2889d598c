"""Exported HF tokenizer files give exactly our ids, on real multilingual text.

transformers' own XLM-R tokenizer would shift every id by one (fairseq's layout), so the export
describes our sentencepiece model to the `tokenizers` library instead (convert/hf_tokenizer.py).
These tests train small tokenizers on six languages in four scripts (Latin, Cyrillic, Greek,
Bengali, plus Japanese and Chinese, where the rarer characters fall back to bytes) and compare
`AutoTokenizer.from_pretrained(folder)` with our tokenizer line by line, mask token included.
"""
import gzip

import pytest

transformers = pytest.importorskip("transformers")

from mlm_jax.evaluation import fill_mask  # noqa: E402
from mlm_jax.convert import tokenizer_files  # noqa: E402
from mlm_jax.data.tokenizers import spm_training  # noqa: E402

# language: (file under corpus/, TSV text column or None)
LANGS = {
    "en": ("en/leipzig/eng_news-typical_2016_10K-sentences.txt.gz", 1),
    "ru": ("ru/tatoeba_cc0_rus.tsv.gz", 2),
    "el": ("el/elwiki_truncated_clean.txt.gz", None),
    "bn": ("bn/bnwiki_truncated_clean.txt.gz", None),
    "ja": ("ja/jawiki_truncated_clean.txt.gz", None),
    "zh": ("zh/hongloumeng.txt.gz", None),
}
TRAIN, HELD_OUT = 250, 60


def _lines(path, field, n):
  out = []
  with gzip.open(path, "rt", encoding="utf-8") as f:
    for line in f:
      line = line.rstrip("\r\n")
      line = line.split("\t")[field] if field is not None else line
      if line.strip():
        out.append(line)
      if len(out) >= n:
        break
  return out


@pytest.fixture(scope="module")
def texts(shared_data, tmp_path_factory):
  """(training files by language, held-out lines of every language)."""
  root = tmp_path_factory.mktemp("hf_tok_corpus")
  train, held = {}, []
  for lang, (rel, field) in LANGS.items():
    lines = _lines(shared_data / "corpus" / rel, field, TRAIN + HELD_OUT)
    (root / f"{lang}.txt").write_text("\n".join(lines[:TRAIN]) + "\n", encoding="utf-8")
    train[lang] = str(root / f"{lang}.txt")
    held += lines[TRAIN:]
  return train, held


# Whitespace runs, tabs, full-width forms, half-width katakana with sound marks, ligatures,
# combining accents, emoji (byte fallback), zero-width space, an empty and a blank line.
EDGE = ["  two   spaces  ", "tab\there", "full\u3000width ＡＢＣ ｽﾍﾟｰｽ", "ﬁ ① ㎏", "🤗 and \u200b zero width",
        "cafe\u0301", "", " ", "日本語のテキスト。", "x" * 40]


@pytest.mark.parametrize("layout,model_type", [("xlmr", "unigram"), ("bert", "bpe")])
def test_auto_tokenizer_gives_our_ids(texts, tmp_path, layout, model_type):
  train, held = texts
  tok = spm_training.train(train, str(tmp_path / "spm"), vocab_size=1500, layout=layout, model_type=model_type,
                              character_coverage=0.98, verbose=False)
  out = tmp_path / "hf"
  out.mkdir()
  tokenizer_files.write(tok, str(out), model_max_length=512)
  theirs = transformers.AutoTokenizer.from_pretrained(str(out))

  lines = held + EDGE
  got = theirs(lines)["input_ids"]
  bad = [(line, [tok.bos_id] + tok.encode(line) + [tok.eos_id], ids)
         for line, ids in zip(lines, got) if ids != [tok.bos_id] + tok.encode(line) + [tok.eos_id]]
  assert not bad, f"{len(bad)} of {len(lines)} lines differ, e.g. {bad[0]}"

  mask = tok.id_to_piece(tok.mask_id)
  assert theirs.mask_token == mask and theirs.mask_token_id == tok.mask_id
  assert (theirs.pad_token_id, theirs.bos_token_id, theirs.eos_token_id, theirs.unk_token_id) == (
      tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id)
  for text in (f"Paris is the {mask} of France.", f"{mask} начало{mask}конец {mask}", f"日本{mask}。"):
    ids, masks = fill_mask.encode_with_masks(tok, text)
    assert theirs(text)["input_ids"] == ids, text
    assert [ids[i] for i in masks] == [tok.mask_id] * text.count(mask)
  # Decoding a single id gives what our decode gives (the fill-mask pipeline's token_str).
  for i in range(tok.vocab_size):
    if tok.processor.is_byte(i) or i in tok.special_ids:
      continue
    assert theirs.decode([i]) == tok.decode([i]), (i, tok.id_to_piece(i))


def test_xlmr_sentencepiece_bpe_model_is_read_with_transformers_ids(texts, tmp_path):
  """A transformers XLM-R folder carries fairseq's sentencepiece.bpe.model (ids shifted by one);
  from_hf / fill_mask --hf_dir rewrite it into our layout, giving transformers' own ids."""
  import sentencepiece as spm
  from mlm_jax.convert import folders
  train, held = texts
  folder = tmp_path / "xlmr"
  folder.mkdir()
  # sentencepiece's defaults are fairseq's: <unk>=0 <s>=1 </s>=2, no <pad>.
  spm.SentencePieceTrainer.train(input=",".join(train.values()), model_prefix=str(folder / "sentencepiece.bpe"),
                                 vocab_size=1500, character_coverage=0.98, minloglevel=2)
  theirs = transformers.XLMRobertaTokenizer.from_pretrained(str(folder))
  ours = folders.folder_tokenizer(str(folder))   # what from_hf and fill_mask --hf_dir read
  assert ours.vocab_size == len(theirs) == 1502
  assert (ours.bos_id, ours.pad_id, ours.eos_id, ours.unk_id, ours.mask_id) == (
      theirs.bos_token_id, theirs.pad_token_id, theirs.eos_token_id, theirs.unk_token_id, theirs.mask_token_id)
  for line in held + ["Paris is the <mask> of France."]:
    want = theirs(line)["input_ids"]
    got = (fill_mask.encode_with_masks(ours, line)[0] if "<mask>" in line
           else [ours.bos_id] + ours.encode(line) + [ours.eos_id])
    assert got == want, line
