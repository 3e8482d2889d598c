"""Shared test fixtures.

The suite runs on CPU with 8 fake XLA devices so that sharding tests can build real meshes;
single-device tests simply use a mesh over the first device.
"""
import atexit
import os
import pathlib
import shutil
import tempfile

from subproc import TEST_XLA_FLAGS

os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {TEST_XLA_FLAGS}")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the session, inherited by every subprocess of the real binaries
# (tests/subproc.py copies this environment): the suite runs the same tiny configs many times, and a
# cached train step starts a run ~14 s sooner (the same executable, so the same numbers).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="mlm_jax_tests_jit_cache_")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


def _data_root() -> pathlib.Path:
  return pathlib.Path(os.environ.get("MLM_JAX_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """The real corpora in ../shared/data (or $MLM_JAX_DATA).

  Missing data skips the test with a reason, except under CI (CI=true) where it fails:
  CI must never go green by skipping the tests that use real text.
  """
  root = _data_root()
  if not (root / "corpus").is_dir():
    msg = f"shared data not found at {root} (set MLM_JAX_DATA to the folder holding corpus/)"
    if os.environ.get("CI", "").lower() == "true":
      pytest.fail(msg)
    pytest.skip(msg)
  return root


@pytest.fixture(scope="session")
def corpus_and_tokenizer(tmp_path_factory):
  """The demo corpus (Python's docs, 600 kB) and a 1000-piece tokenizer trained on it, once per session.

  For runs of the training binary that must not depend on ../shared (see tests/test_train.py).
  """
  from mlm_jax.data import demo_corpus
  from mlm_jax.data.tokenizers import spm_training
  root = tmp_path_factory.mktemp("demo_data")
  path = demo_corpus.write(str(root / "corpus"), max_bytes=600_000)
  tok = spm_training.train([path], str(root / "spm"), vocab_size=1000, layout="xlmr", verbose=False)
  return path, tok.model_path


# Files that run the binaries for minutes go first: under the README's `-n 2 --dist loadfile` each
# file stays on one worker (its module fixtures built once), and a long file started last would
# leave the other worker idle at the end.
SLOW_FIRST = ("test_train.py", "test_multihost.py", "test_phases.py", "test_downstream.py",
              "test_finetune_pretrained.py", "test_zeroshot.py", "test_fill_mask.py", "test_sentence_pairs.py",
              "test_console.py", "test_step.py", "test_finetune.py", "test_gpt_bert.py", "test_matmul.py",
              "test_store_beam.py", "test_goodput.py")


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(SLOW_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: a file's own order is kept
