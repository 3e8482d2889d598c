"""Real text, tokenized with a real sentencepiece model, packed into batches of the pipeline's format.

For tests of the model-side code (masking, steps) that must not depend on the tf.data pipeline:
uses the sentencepiece model shipped in shared/data (trained on botchan.txt) and packs lines of
botchan into rows exactly as the batch format specifies.
"""
import gzip

import numpy as np
import sentencepiece as spm

# The shipped model has <unk>=0, <s>=1, </s>=2 and 1000 pieces; we add <pad> and <mask> after it.
UNK, BOS, EOS, PAD, MASK = 0, 1, 2, 1000, 1001
VOCAB = 1002
SPECIALS = (UNK, BOS, EOS, PAD)


def load(shared_data):
  sp = spm.SentencePieceProcessor(model_file=str(shared_data / "models/sentencepiece/test_model.model"))
  with gzip.open(shared_data / "corpus/en/botchan.txt.gz", "rt", encoding="utf-8-sig") as f:
    lines = [l.strip() for l in f if l.strip()]
  return sp, lines


def packed_batches(sp, lines, seq_len, lines_per_doc=1, max_rows=None):
  """Documents (groups of lines) as <s> ... </s>, packed greedily into rows; long ones split."""
  chunks = []   # each: list of (token, word_start)
  for i in range(0, len(lines), lines_per_doc):
    pieces = sp.encode(" ".join(lines[i:i + lines_per_doc]), out_type=str)
    toks = [(sp.piece_to_id(p), int(p.startswith("\u2581"))) for p in pieces]
    for c in range(0, len(toks), seq_len - 2):
      body = toks[c:c + seq_len - 2]
      body[0] = (body[0][0], 1)   # the first token of a document (chunk) starts a word
      chunks.append([(BOS, 1)] + body + [(EOS, 1)])
  rows, row = [], []
  for chunk in chunks:
    if sum(len(c) for c in row) + len(chunk) > seq_len:
      rows.append(row)
      row = []
    row.append(chunk)
  rows.append(row)
  rows = rows[:max_rows] if max_rows else rows
  n = len(rows)
  out = dict(input_ids=np.full((n, seq_len), PAD, np.int32), segment_ids=np.zeros((n, seq_len), np.int32),
             positions=np.zeros((n, seq_len), np.int32), word_starts=np.zeros((n, seq_len), np.int32))
  for i, row in enumerate(rows):
    j = 0
    for seg, chunk in enumerate(row, start=1):
      for pos, (tok, start) in enumerate(chunk):
        out["input_ids"][i, j], out["word_starts"][i, j] = tok, start
        out["segment_ids"][i, j], out["positions"][i, j] = seg, pos
        j += 1
  return out
