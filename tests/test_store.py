"""Token store: prepare (atomic, resumable, worker-independent) and the O(1)-resumable reader."""
import collections
import gc
import gzip
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from mlm_jax.data import packing
from mlm_jax.config import defaults
from mlm_jax.data.store import shards
from mlm_jax.data.store import index as store_index
from mlm_jax.data.store import loader
from mlm_jax.data.store import prepare
from mlm_jax.data.tokenizers import spm_training
from mlm_jax.errors import DataError
from subproc import REPO, cpu_env

DE = "corpus/de/gutenberg_kalamine/*.txt.gz"                    # 3 books, BOM + CRLF
EN = "corpus/en/leipzig/eng_news-typical_2016_10K-sentences.txt.gz"


@pytest.fixture(scope="session")
def tok(shared_data, tmp_path_factory):
  root = tmp_path_factory.mktemp("store_tok")
  return spm_training.train([f"de={shared_data / DE}", f"en=tsv:1:{shared_data / EN}"],
                               str(root / "spm"), vocab_size=600, max_sentences_per_language=2000,
                               input_sentence_size=4000, verbose=False)


def _opts(shared_data, tok, **kw):
  kw.setdefault("sources", (f"de={shared_data / DE}", f"en=tsv:1:{shared_data / EN}"))
  return prepare.Options(tokenizer=tok.model_path, eval_percent=2.0, **kw)


@pytest.fixture(scope="session")
def store(shared_data, tok, tmp_path_factory):
  root = str(tmp_path_factory.mktemp("store") / "s")
  prepare.prepare(_opts(shared_data, tok), root, progress_s=1e9, log=lambda s: None)
  return root


def _cfg(store, tmp_path, **kw):
  c = defaults.data_defaults()
  c.sources = (f"store:{store}",)
  c.seq_len = 32
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def _pipe(c, tmp_path, batch=8, **kw):
  return loader.StorePipeline(c, batch, seed=kw.pop("seed", 3),
                                      cache_dir=str(tmp_path / "index"), **kw)


def _files(root):
  out = {}
  for d, _, names in os.walk(root):
    for n in names:
      p = os.path.join(d, n)
      with open(p, "rb") as f:
        out[os.path.relpath(p, root)] = (f.read(), os.stat(p).st_mtime_ns)
  return out


def test_permutation_known_answer():
  """Pins the stateless shuffle: a TensorFlow upgrade must not silently reorder batches."""
  got = store_index.permute(np.arange(8), seed=0, salt=0, epoch=0, size=1000).tolist()
  assert got == KNOWN_PERMUTATION
  assert sorted(store_index.permute(np.arange(50), 1, 2, 3, 50).tolist()) == list(range(50))


KNOWN_PERMUTATION = [759, 884, 542, 906, 15, 998, 59, 775]  # TF 2.20 index_shuffle


@pytest.mark.parametrize("fit", ["best", "next"])
def test_epoch_has_every_token_once(shared_data, store, tok, tmp_path, fit):
  """One epoch of one source, segmented: exactly the chunks of its documents, each once."""
  c = _cfg(f"{store}:de", tmp_path, packing_fit=fit)
  p = _pipe(c, tmp_path, batch=16)
  rows = p.streams[0].rows
  batches = [next(p) for _ in range((rows + 15) // 16)]
  got = []
  for b, r in [(b, r) for b in batches for r in range(16)][:rows]:
    ids, seg, pos = b["input_ids"][r], b["segment_ids"][r], b["positions"][r]
    assert (ids[seg == 0] == tok.pad_id).all() and (pos[seg == 0] == 0).all()
    for s in range(1, seg.max() + 1):
      piece = ids[seg == s]
      assert piece[0] == tok.bos_id and piece[-1] == tok.eos_id
      assert (pos[seg == s] == np.arange(piece.size)).all()
      got.append(tuple(piece[1:-1].tolist()))
  want = []
  st = shards.Store(store)
  lens = st.lengths("de", "train")
  for d in st.read("de", "train", np.arange(lens.size)):
    want += [tuple(d.ids[i:i + 30].tolist()) for i in range(0, d.ids.size, 30)]
  assert collections.Counter(got) == collections.Counter(want)
  # and the store holds what sentencepiece makes of the text (first documents of de_alice)
  with gzip.open(shared_data / "corpus/de/gutenberg_kalamine/de_alice.txt.gz", "rt",
                 encoding="utf-8-sig") as f:
    first = [line.strip() for line in f if line.strip()][:5]
  docs = [d.ids.tolist() for d in st.read("de", "train", np.arange(3))]
  assert any(tok.encode(line) in docs for line in first)


@pytest.mark.parametrize("packing", ["concat", "segmented"])
def test_batches_identical_for_1_2_4_processes(store, tmp_path, packing):
  c = _cfg(store, tmp_path, mix_alpha=0.5, packing=packing)
  want = None
  for n in (1, 2, 4):
    procs = [_pipe(c, tmp_path, batch=8 // n, process_index=i, process_count=n)
             for i in range(n)]
    got = [np.concatenate([next(q)["input_ids"] for q in procs]) for _ in range(6)]
    if want is None:
      want = got
    np.testing.assert_array_equal(np.stack(got), np.stack(want))
  labels = {s.label for s in procs[0].streams}
  assert labels == {"de", "en"}
  assert {k for k, v in procs[0].stats()["sources"].items() if v["rows"]} == labels


def test_resume_at_any_row_and_batch_size(store, tmp_path):
  c = _cfg(store, tmp_path, mix_alpha=0.3)
  run = _pipe(c, tmp_path, batch=8)
  for _ in range(7):
    next(run)
  state = run.get_state()
  assert state["rows"] == 56 and len(str(state)) < 800
  nxt = [next(run) for _ in range(2)]
  again = _pipe(c, tmp_path, batch=8)
  again.set_state(state)
  for want in nxt:
    got = next(again)
    for k in loader.FEATURES:
      np.testing.assert_array_equal(got[k], want[k])
  half = _pipe(c, tmp_path, batch=4)
  half.set_state(state)
  np.testing.assert_array_equal(np.concatenate([next(half)["input_ids"] for _ in range(2)]),
                                nxt[0]["input_ids"])
  far = _pipe(c, tmp_path, batch=8)
  t0 = time.perf_counter()
  far.set_state(dict(state, rows=10**9))
  next(far)
  assert time.perf_counter() - t0 < 2.0
  assert far.stats()["sources"]["de"]["epochs"] > 1


def test_rows_hold_the_pieces_of_their_documents(store, tmp_path):
  """Each row, feature by feature, against the packing index and Store.read, piece by piece."""
  for packing in ("segmented", "concat"):
    p = _pipe(_cfg(store, tmp_path, packing=packing, mix_alpha=0.5), tmp_path, batch=16)
    next(p)
    got = next(p)
    src, packed = p._locate(16 + np.arange(16))
    for r in range(16):
      st = p.streams[src[r]]
      ix, ids, ws, seg = st.index, [], [], []
      for k, q in enumerate(range(ix["row_ptr"][packed[r]], ix["row_ptr"][packed[r] + 1]), start=1):
        d = st.store.read(st.name, "train", [ix["piece_doc"][q]])[0]
        a, n = int(ix["piece_start"][q]), int(ix["piece_len"][q])
        if packing == "segmented":
          ids += [p.bos_id] + d.ids[a:a + n].tolist() + [p.eos_id]
          ws += [1, 1] + d.word_starts[a + 1:a + n].tolist() + [1]
          seg += [k] * (n + 2)
        else:
          ids += ([p.bos_id] + d.ids.tolist() + [p.eos_id])[a:a + n]
          ws += ([1] + d.word_starts.tolist() + [1])[a:a + n]
          seg += [1] * n
      ws[0] = 1
      m = len(ids)
      assert got["input_ids"][r, :m].tolist() == ids and (got["input_ids"][r, m:] == p.pad_id).all()
      assert got["word_starts"][r, :m].tolist() == ws
      assert got["segment_ids"][r].tolist() == seg + [0] * (p.seq_len - m)


def test_worker_processes_build_the_same_batches(store, tmp_path):
  """data.store_workers: the same batches, stats and resume as in-process; a worker's death is one
  line (and corrupt shards, in test_corrupt_and_truncated_shards, too)."""
  c = dict(mix_alpha=0.5, packing="concat")
  inline = _pipe(_cfg(store, tmp_path, **c), tmp_path)
  want = [next(inline) for _ in range(10)]
  w = _pipe(_cfg(store, tmp_path, store_workers=2, **c), tmp_path)
  for b in want[:6]:
    got = next(w)
    assert all((got[k] == b[k]).all() for k in loader.FEATURES)
  six = _pipe(_cfg(store, tmp_path, **c), tmp_path)
  for _ in range(6):
    next(six)
  assert w.get_state() == six.get_state() and w.stats() == six.stats()
  w.set_state(dict(w.get_state(), rows=24))          # back: what was built ahead is dropped
  for b in want[3:8]:
    assert (next(w)["input_ids"] == b["input_ids"]).all()
  procs = list(w._workers._procs)
  del w
  gc.collect()                                        # a dropped pipeline's workers end
  assert [p.wait(timeout=10) for p in procs] == [0, 0]
  w = _pipe(_cfg(store, tmp_path, store_workers=2, **c), tmp_path)
  next(w)
  procs = list(w._workers._procs)
  procs[0].kill()
  with pytest.raises(DataError) as e:
    for _ in range(20):
      next(w)
  assert "store batch worker" in str(e.value) and "\n" not in str(e.value)
  assert [p.wait(timeout=10) for p in procs][1] == 0   # the failed pipeline's other worker ends with it


def test_best_fit_window():
  """Least room that fits, ties to the lowest slot, the fullest row closed when the window is full;
  the same rows whether the items come in one call or in groups with the window carried."""
  w = packing.Window(10, 2)
  slots, offsets, rows, closed = w.place([6, 5, 4, 7])
  # 6 -> new row 0; 5 -> new row 1; 4 -> row 0 (room 4 is the least that fits; then full: closed);
  # 7 -> new row 2 in the freed slot 0
  assert list(slots) == [0, 1, 0, 0] and list(offsets) == [0, 0, 6, 0] and list(rows) == [0, 1, 0, 2]
  assert closed == [(3, 0, 0)] and w.fill == [7, 5]
  slots, offsets, rows, closed = w.place([6, 3])
  # 6 fits neither (rooms 3, 5): the window is full, so the fullest row (2, room 3) is closed first;
  # 3 then goes into the new row 3 (room 4, then full: closed), not row 1 (room 5)
  assert list(slots) == [0, 0] and list(rows) == [3, 3] and closed == [(0, 0, 2), (2, 0, 3)]
  rng = np.random.default_rng(0)
  items = rng.integers(2, 64, 3000).tolist()
  one = packing.Window(64, 16).place(items)
  w, got = packing.Window(64, 16), []
  for a in range(0, len(items), 100):
    got.append(w.place(items[a:a + 100])[2])
  assert list(one[2]) == [r for g in got for r in g]


def test_best_fit_fills_rows_and_next_fit_runs_resume_again_and_again(store, tmp_path):
  """Best-fit rows are fuller than next-fit's; a run whose rows are next-fit (its state names 'next')
  resumes onto them under the default 'best' at every resume, not only the first; an explicit 'next'
  against best-fit rows is refused. (States from before data.packing_fit: tests/test_migrate.py.)"""
  fill = {}
  for fit in ("next", "best"):
    p = _pipe(_cfg(store, tmp_path, packing_fit=fit), tmp_path)
    fill[fit] = np.mean([s.index["row_tokens"].mean() / 32 for s in p.streams])
  assert fill["best"] > fill["next"] + 0.1   # seq_len 32: 0.89 against 0.73
  reference = _pipe(_cfg(store, tmp_path, packing_fit="next", mix_alpha=0.5), tmp_path)
  for _ in range(3):
    next(reference)
  named = json.loads(json.dumps(reference.get_state()))
  want = [next(reference) for _ in range(3)]
  first = _pipe(_cfg(store, tmp_path, mix_alpha=0.5), tmp_path)
  assert first.fit == "best" and first.adopted_config() == {}
  first.set_state(named)
  assert first.fit == "next" and first.adopted_config() == {"data.packing_fit": "next"}
  got = next(first)
  assert all((got[k] == want[0][k]).all() for k in loader.FEATURES)
  saved = json.loads(json.dumps(first.get_state()))   # the first resume's checkpoint names 'next'
  assert saved["config"]["packing_fit"] == "next"
  second = _pipe(_cfg(store, tmp_path, mix_alpha=0.5), tmp_path)
  second.set_state(saved)                              # the second resume, under the default again
  assert second.adopted_config() == {"data.packing_fit": "next"}
  for w in want[1:]:
    got = next(second)
    assert all((got[k] == w[k]).all() for k in loader.FEATURES)
  best = _pipe(_cfg(store, tmp_path), tmp_path).get_state()
  with pytest.raises(DataError, match=r"data\.packing_fit changed \('best' saved, 'next' now\)"):
    _pipe(_cfg(store, tmp_path, packing_fit="next"), tmp_path).set_state(best)


def test_resume_errors_name_what_changed(store, tok, shared_data, tmp_path):
  state = _pipe(_cfg(store, tmp_path), tmp_path).get_state()
  with pytest.raises(DataError, match=r"data\.seq_len changed \(32 saved, 64 now\)"):
    _pipe(_cfg(store, tmp_path, seq_len=64), tmp_path).set_state(state)
  with pytest.raises(DataError, match="store of source 'de' differs"):
    _pipe(_cfg(store, tmp_path), tmp_path).set_state(
        dict(state, stores=dict(state["stores"], de="0" * 16)))
  other = str(shared_data / "models/sentencepiece/test_model.model")
  before = _files(store)
  with pytest.raises(DataError) as e:
    _pipe(_cfg(store, tmp_path, tokenizer=other), tmp_path)
  assert "is not the tokenizer of store" in str(e.value) and "\n" not in str(e.value)
  assert _files(store) == before
  with pytest.raises(DataError, match="gs://bucket/store: a store must be a local or mounted directory"):
    _pipe(_cfg("gs://bucket/store", tmp_path), tmp_path)
  assert not os.path.exists("gs:")
  assert store_index.cache_dir_for("gs://bucket/run") == store_index.default_cache_dir()
  assert store_index.cache_dir_for("/runs/a") == "/runs/a/data_index"


@pytest.mark.parametrize("workers", [0, 1])
def test_corrupt_and_truncated_shards(store, tmp_path, workers):
  for damage in ("flip", "truncate"):
    bad = str(tmp_path / damage)
    shutil.copytree(store, bad)
    shard = os.path.join(bad, "data", "de", "000000.train.arrayrecord")
    data = bytearray(open(shard, "rb").read())
    if damage == "flip":
      for i in range(100, len(data) - 20000, 997):
        data[i] ^= 0x5A
    else:
      data = data[:len(data) // 2]
    open(shard, "wb").write(bytes(data))
    p = _pipe(_cfg(f"{bad}:de", tmp_path, store_workers=workers), tmp_path, batch=64)
    with pytest.raises(DataError) as e:
      for _ in range(40):
        next(p)
    assert shard in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------
# prepare
# ------------------------------------------------------------------------------------------
def test_prepare_rerun_resume_and_workers(shared_data, tok, store, tmp_path):
  before = _files(store)
  prepare.prepare(_opts(shared_data, tok), store, progress_s=1e9, log=lambda s: None)
  assert _files(store) == before                     # re-run: nothing rewritten (mtimes too)
  # killed midway: no manifest, a unit without its done marker, half-written temporary files (removed
  # once every unit is done)
  killed = str(tmp_path / "killed")
  shutil.copytree(store, killed)
  os.remove(os.path.join(killed, "manifest.json"))
  os.remove(os.path.join(killed, "data", "de", "000001.json"))
  os.remove(os.path.join(killed, "data", "de", "000001.train.arrayrecord"))
  for partial in ("data/de/000001.eval.arrayrecord.tmp-99-0a1b2c3d", "data/en/000000.json.tmp-7-00000000"):
    with open(os.path.join(killed, partial), "wb") as f:
      f.write(b"partial")
  with pytest.raises(DataError, match="1 units not prepared, first de unit 1"):
    prepare.write_manifest(killed, _opts(shared_data, tok), tok, tok.sha256,
                           prepare.plan(_opts(shared_data, tok)))
  prepare.prepare(_opts(shared_data, tok), killed, progress_s=1e9, log=lambda s: None)
  assert {k: v[0] for k, v in _files(killed).items()} == {k: v[0] for k, v in before.items()}
  two = str(tmp_path / "two")
  prepare.prepare(_opts(shared_data, tok), two, num_workers=2, progress_s=1e9, log=lambda s: None)
  assert {k: v[0] for k, v in _files(two).items()} == {k: v[0] for k, v in before.items()}
  # a remote root (gs:// on Dataflow; TensorFlow's ram:// here): each unit written locally, then copied
  remote = "ram://prepare_test/store"
  assert prepare.prepare(_opts(shared_data, tok), remote, progress_s=1e9, log=lambda s: None) == \
      json.loads(before["manifest.json"][0])
  import tensorflow as tf
  got = {os.path.relpath(p, remote): tf.io.gfile.GFile(p, "rb").read()
         for d, _, names in tf.io.gfile.walk(remote) for p in (os.path.join(d, n) for n in names)}
  assert got == {k: v[0] for k, v in before.items()}
  with pytest.raises(DataError, match="prepared with other options"):
    prepare.prepare(_opts(shared_data, tok, doc_format="blank_line"), two, log=lambda s: None)


def test_make_input_picks_the_path_from_sources_and_input_kind(store, tmp_path):
  """data/input.py make_input, the one function a run's input comes from: store sources give this
  process's rows of the store pipeline's global batches; pairs need a store; a kind no objective
  has is a one-line error."""
  import ml_collections
  from mlm_jax.data import inputs
  c = _cfg(store, tmp_path)
  run = ml_collections.ConfigDict(dict(data=c, train=dict(batch_size=8), seed=3))
  got = inputs.make_input(run, "rows", None, process_index=1, process_count=2, workdir=str(tmp_path))
  assert isinstance(got, loader.StorePipeline)
  whole = _pipe(c, tmp_path)
  for _ in range(3):
    np.testing.assert_array_equal(next(got)["input_ids"], next(whole)["input_ids"][4:])
  with pytest.raises(DataError, match="input kind 'pairs': expected one of"):
    inputs.make_input(run, "pairs", None)
  run.data.sources = ("de=corpus/*.txt",)
  with pytest.raises(DataError, match="SOP sentence pairs are read from a token store"):
    inputs.make_input(run, "sop_pairs", None)


def test_store_path_imports_neither_tensorflow_nor_the_streaming_path():
  """The store modules (the batch workers run `python -m mlm_jax.data.store.batch`), the input
  choice, the specs and the tokenizers import no TensorFlow, jax or text/ (which sets TensorFlow up
  at import): a worker process or a config check never pays for them."""
  code = ("import sys\n"
          "import mlm_jax.data.store.batch, mlm_jax.data.store.shards, mlm_jax.data.store.index\n"
          "import mlm_jax.data.store.pairs, mlm_jax.data.store.loader, mlm_jax.data.store.prepare\n"
          "import mlm_jax.data.store.text_reader, mlm_jax.data.inputs, mlm_jax.data.specs\n"
          "import mlm_jax.data.tokenizers.load, mlm_jax.data.tokenizers.spm_training\n"
          "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'jax')"
          " or m.startswith('mlm_jax.data.text'))\n"
          "assert not bad, bad\n")
  p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=cpu_env(), capture_output=True, text=True,
                     timeout=120)
  assert p.returncode == 0, p.stderr[-2000:]


def test_a_moved_store_resumes(store, tmp_path):
  """A store copied to another path is the same store (its manifest names it, not its path). (A state
  written when the config's paths were part of it: tests/test_migrate.py.)"""
  c = _cfg(store, tmp_path)
  run = _pipe(c, tmp_path)
  for _ in range(3):
    next(run)
  state = json.loads(json.dumps(run.get_state()))
  want = next(run)
  moved = str(tmp_path / "other_disk" / "store")
  shutil.copytree(store, moved)
  again = _pipe(_cfg(moved, tmp_path), tmp_path)
  again.set_state(state)
  got = next(again)
  for k in loader.FEATURES:
    np.testing.assert_array_equal(got[k], want[k])


def test_config_json_records_the_fit_a_resumed_run_adopts(store, tmp_path):
  """The real loop on a store: a run on next-fit rows, restored twice under the default 'best', and
  config.json says 'next', the rows it reads (a tiny encoder; the batches: the pipeline test above)."""
  from mlm_jax.config.defaults import default_config
  from mlm_jax.data import inputs
  from mlm_jax.model import sharding
  from mlm_jax.training import loop, resolve, trainer as trainer_lib
  from mlm_jax.workdir import files as workdir_files
  import jax

  def run(steps, **data):
    c = default_config()
    c.model.update(vocab_size=600, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                   max_position_embeddings=32)
    c.data.update(sources=(f"store:{store}",), seq_len=32, **data)
    c.train.update(steps=steps, batch_size=4, log_every=1, save_every=2, eval_every=0)
    r = resolve.resolve_for_compile(c)
    tr = trainer_lib.make_trainer(r.config, sharding.make_mesh(r.config.mesh, jax.devices()[:1]),
                                  r.objective)
    pipe = _pipe(r.config.data, tmp_path, batch=4)
    loop.Loop(tr, str(tmp_path / "run"), inputs.LoopInput(pipe), None, tr.init, tokens_per_example=32,
              flops_per_token=1.0, user_config=r.user).run()
    with open(tmp_path / "run" / "config.json") as f:
      users = json.load(f)["config"]["data"]["packing_fit"]
    return users, workdir_files.read_config(str(tmp_path / "run")).data.packing_fit, pipe.get_state()["rows"]

  assert run(2, packing_fit="next") == ("next", "next", 8)
  # Rerunning a finished run restores it and writes config.json (no step): under the default 'best'
  # the first resume adopts the saved fit, and so does the second (its checkpoint is the same); the
  # user's config keeps its 'best', the fit the run reads is derived.
  assert run(2) == ("best", "next", 8)
  assert run(2) == ("best", "next", 8)


@pytest.mark.parametrize("packing", ["concat", "segmented"])
def test_an_index_cache_is_used_again_without_a_warning(store, tmp_path, caplog, packing):
  """The second pipeline on the same store, split, sequence length and packing (a resumed run, the next
  phase of a run in phases) reads the first one's index as it is; concat pieces carry the BOS and EOS
  of their document, which the check allows for."""
  c = _cfg(store, tmp_path, packing=packing)
  want = next(_pipe(c, tmp_path))
  with caplog.at_level("WARNING"):
    got = next(_pipe(c, tmp_path))
  assert all((got[k] == want[k]).all() for k in loader.FEATURES)
  assert not [r.getMessage() for r in caplog.records if "index cache" in r.getMessage()]


def test_index_cache_is_private_and_checked(store, tmp_path, monkeypatch, caplog):
  """The default index cache is this user's (uid in the name, mode 0700; another user's is refused);
  a folder whose key.json names another index, a truncated array, or arrays that point past the
  store's documents are not trusted: the index is built again, with a warning, and batches are right."""
  import tempfile
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  default = store_index.default_cache_dir()
  assert default == str(tmp_path / f"mlm_jax_data_index-{os.getuid()}")
  os.makedirs(default, mode=0o777)
  os.chmod(default, 0o777)
  c = _cfg(store, tmp_path)
  want = [next(loader.StorePipeline(c, 8, seed=3)) for _ in range(1)][0]
  assert os.stat(default).st_mode & 0o777 == 0o700
  folders = [os.path.join(default, n) for n in sorted(os.listdir(default))]
  assert len(folders) == 2   # one index per source (de, en)

  def planted(edit):
    caplog.clear()
    for f in folders:
      edit(f)
    got = next(loader.StorePipeline(c, 8, seed=3))
    assert all((got[k] == want[k]).all() for k in loader.FEATURES)
    warned = [r.getMessage() for r in caplog.records if "index cache" in r.getMessage()]
    assert len(warned) == 2 and all("\n" not in w for w in warned), warned
    return warned[0]

  def other_key(f):
    with open(os.path.join(f, "key.json"), "w") as fh:
      json.dump({"store": "someone else's"}, fh)

  def truncate(f):
    with open(os.path.join(f, "row_ptr.npy"), "r+b") as fh:
      fh.truncate(100)

  def out_of_bounds(f):
    np.save(os.path.join(f, "piece_doc.npy"), np.full_like(np.load(os.path.join(f, "piece_doc.npy")), 10**9))

  with caplog.at_level("WARNING"):
    assert "has a key.json for another index" in planted(other_key)
    assert "is damaged" in planted(truncate)
    assert "is damaged (a piece names a document the store does not have)" in planted(out_of_bounds)
  os.chown(default, 12345, 12345)
  for f in folders:
    other_key(f)
  with pytest.raises(DataError, match=r"belongs to uid 12345, not to you"):
    loader.StorePipeline(c, 8, seed=3)
