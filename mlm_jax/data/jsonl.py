"""JSON-lines sources (`jsonl:FIELD:GLOB`): one record's text field -> the lines the readers clean.

Hugging Face datasets, C4 and most web dumps ship as JSON lines with the text in one field. A record
reads as a file of its own would: the lines of its text, then a blank line, so that
`data.doc_format=blank_line` never joins two records into one document and `line` makes a document of
each line. Both input paths (text/sources.py in tf.data, store/text_reader.py in plain Python) go
through `record_lines`, so the streaming path and a token store hold the same documents.
"""
import json
from typing import Optional


def record_lines(raw: str, field: str) -> Optional[list]:
  """The lines of `raw`'s `field` followed by '' ([] for a blank line between records).

  None when `raw` is not a JSON object with a string `field`: the readers skip it and count it
  (`bad_json_records`; an error under data.strict).
  """
  raw = raw.lstrip("\ufeff")
  if not raw.strip():
    return []
  try:
    record = json.loads(raw)
  except ValueError:
    return None
  text = record.get(field) if isinstance(record, dict) else None
  if not isinstance(text, str):
    return None
  # A lone surrogate escape ("\ud800") decodes to a str that is not UTF-8: it becomes '?'.
  text = text.encode("utf-8", "replace").decode("utf-8")
  return text.split("\n") + [""]
