"""prepare as an Apache Beam pipeline (DirectRunner, 2 worker processes): the in-process store's bytes,
whichever ran it, killed and re-run too; Beam counters per source; a failing unit named in one line."""
import gzip
import os
import signal
import subprocess
import sys
import time

import pytest

from mlm_jax.data.store import prepare
from mlm_jax.data.tokenizers import load as tokenizer_load, spm_training
from mlm_jax.errors import DataError
from subproc import REPO, cpu_env

DE = "corpus/de/gutenberg_kalamine"
RU = "corpus/ru/tatoeba_cc0_rus.tsv.gz"
EN = "corpus/en/leipzig/eng_news-typical_2016_10K-sentences.txt.gz"
TWO_WORKERS = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")


@pytest.fixture(scope="module")
def beam_pipeline():
  try:
    import apache_beam  # noqa: F401
  except ImportError:
    msg = "apache_beam is not installed (pip install -e '.[beam]', as the README's test command does)"
    if os.environ.get("CI", "").lower() == "true":
      pytest.fail(msg)
    pytest.skip(msg)
  from mlm_jax.data.store import beam_pipeline
  return beam_pipeline


def _lines(path, n):
  with gzip.open(path, "rb") as f:
    return [next(f) for _ in range(n)]


@pytest.fixture(scope="module")
def opts(shared_data, tmp_path_factory):
  """Slices of real corpora, four sources of three unit kinds: German books (text, 3 files), Russian
  Tatoeba (tsv, 2 files), English news as token ids (tfrecord, 2 files), and hostile files (invalid
  UTF-8, an empty file, a line over max_line_bytes, a truncated .gz: repaired and counted)."""
  import tensorflow as tf
  root = tmp_path_factory.mktemp("beam_corpus")
  for d in ("de", "ru", "ids", "bad"):
    (root / d).mkdir()
  for book in sorted(os.listdir(shared_data / DE)):
    (root / "de" / book).write_bytes(gzip.compress(b"".join(_lines(shared_data / DE / book, 300))))
  ru = _lines(shared_data / RU, 1200)
  for k in range(2):
    (root / "ru" / f"part{k}.tsv.gz").write_bytes(gzip.compress(b"".join(ru[k::2])))
  tok = spm_training.train([f"de={root / 'de'}/*.txt.gz", f"en=tsv:1:{shared_data / EN}"],
                           str(root / "spm"), vocab_size=600, max_sentences_per_language=1500,
                           input_sentence_size=3000, verbose=False)
  en = [line.decode().split("\t", 1)[1].strip() for line in _lines(shared_data / EN, 400)]
  ids = tokenizer_load.load(tok.model_path).encode_batch(en)
  for k in range(2):
    with tf.io.TFRecordWriter(str(root / "ids" / f"part{k}.tfrecord")) as w:
      for doc in ids[k::2]:
        feature = tf.train.Feature(int64_list=tf.train.Int64List(value=doc))
        w.write(tf.train.Example(features=tf.train.Features(
            feature={"input_ids": feature})).SerializeToString())
  (root / "bad" / "a_utf8.txt").write_bytes(b"gut\n\xff\xfe kaputt\nnoch gut\n")
  (root / "bad" / "b_empty.txt").write_bytes(b"")
  (root / "bad" / "c_long.txt").write_bytes(b"Guten Tag.\n" + b"Wort " * 2000 + b"\nEnde.\n")
  packed = gzip.compress(b"".join(_lines(shared_data / DE / "de_alice.txt.gz", 400)))
  (root / "bad" / "d_cut.txt.gz").write_bytes(packed[:len(packed) // 2])
  return prepare.Options(sources=(f"de={root}/de/*.txt.gz", f"ru=tsv:2:{root}/ru/*.tsv.gz",
                                  f"ids=tfrecord:{root}/ids/*.tfrecord", f"bad={root}/bad/*"),
                         tokenizer=tok.model_path, eval_percent=2.0, max_line_bytes=4096)


@pytest.fixture(scope="module")
def in_process(opts, tmp_path_factory):
  root = str(tmp_path_factory.mktemp("beam_ref") / "store")
  manifest = prepare.prepare(opts, root, progress_s=1e9, log=lambda s: None)
  return root, manifest


def _files(root):
  out = {}
  for d, _, names in os.walk(root):
    for n in names:
      with open(os.path.join(d, n), "rb") as f:
        out[os.path.relpath(os.path.join(d, n), root)] = f.read()
  return out


def test_beam_writes_the_in_process_store_killed_and_run_again_too(beam_pipeline, opts, in_process, tmp_path):
  """Every unit prepared by Beam (2 worker processes): some by a run killed midway (the tool, its runner
  and workers killed at once), the rest by a second run; the store is the in-process one, byte for byte."""
  ref, ref_manifest = in_process
  stats = ref_manifest["sources"]["bad"]["stats"]
  assert all(stats[k] == 1 for k in ("invalid_utf8_lines", "empty_files", "truncated_files"))
  assert stats["long_lines_cut"] > 0
  out = tmp_path / "store"
  cmd = [sys.executable, "tools/prepare_data.py", "--runner=DirectRunner", "--num_workers=2",
         f"--tokenizer={opts.tokenizer}", f"--out={out}", f"--eval_percent={opts.eval_percent}",
         f"--max_line_bytes={opts.max_line_bytes}"] + [f"--sources={s}" for s in opts.sources]
  log = open(tmp_path / "killed.log", "wb")
  proc = subprocess.Popen(cmd, cwd=REPO, env=dict(cpu_env(), PYTHONPATH=str(REPO)), start_new_session=True,
                          stdout=log, stderr=subprocess.STDOUT)
  try:
    deadline = time.time() + 300
    while not list(out.glob("data/*/*.json")) and proc.poll() is None and time.time() < deadline:
      time.sleep(0.01)
  finally:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    log.close()
  done = {(p.parent.name, int(p.stem)) for p in out.glob("data/*/*.json")}
  assert 0 < len(done) < 11 and not (out / "manifest.json").exists(), \
      (done, (tmp_path / "killed.log").read_text(errors="replace")[-3000:])
  manifest, counters = beam_pipeline.run(opts, str(out), "DirectRunner", TWO_WORKERS, log=lambda s: None)
  assert manifest == ref_manifest
  got, want = _files(out), _files(ref)
  assert sorted(got) == sorted(want) and len(want) == 4 + 4 * 11   # manifest, options, tokenizer x2
  assert [k for k in want if got[k] != want[k]] == []
  for name, src in ref_manifest["sources"].items():   # Beam's counters: the second run's work
    redone = [u for u in src["units"] if (name, u["unit"]) not in done]
    expect = dict(units_prepared=len(redone), units_skipped=len(src["units"]) - len(redone),
                  documents=sum(u["train_docs"] + u["eval_docs"] for u in redone),
                  tokens=sum(u["train_tokens"] + u["eval_tokens"] for u in redone))
    for k in src["stats"]:
      expect[k] = sum(u["stats"][k] for u in redone)
    assert counters.get(name, {}) == {k: v for k, v in expect.items() if v}, name


def test_a_failing_unit_is_one_line_naming_source_and_file(beam_pipeline, opts, tmp_path):
  strict = prepare.Options(**dict(vars(opts), sources=opts.sources[-1:], strict=True))
  with pytest.raises(Exception) as e:
    beam_pipeline.run(strict, str(tmp_path / "s"), "DirectRunner", ("--direct_num_workers=1",),
                      log=lambda s: None)
  line = beam_pipeline.failure_line(e.value)
  assert line.startswith("cannot prepare source 'bad' unit ") and "\n" not in line
  assert any(f"{name}: {what}" in line for name, what in (
      ("a_utf8.txt", "invalid utf8 lines"), ("b_empty.txt", "empty files"),
      ("c_long.txt", "long lines cut"), ("d_cut.txt.gz", "truncated files"))), line
  with pytest.raises(DataError, match=r"cannot prepare source 'bad' unit 0: \S+a_utf8.txt: invalid utf8"):
    prepare.prepare(strict, str(tmp_path / "in_process"), log=lambda s: None)


def test_only_the_beam_module_imports_apache_beam_and_only_in_functions():
  """Nothing but `--runner` needs the [beam] extra installed."""
  import ast
  found = {}
  for path in sorted([*(REPO / "mlm_jax").rglob("*.py"), *(REPO / "tools").glob("*.py")]):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    in_functions = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                    for n in ast.walk(f)}
    for node in ast.walk(tree):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      if any(n.split(".")[0] == "apache_beam" for n in names):
        found.setdefault(str(path.relative_to(REPO)), set()).add("function" if id(node) in in_functions else "module level")
  assert found == {"mlm_jax/data/store/beam_pipeline.py": {"function"}}, found
