"""The training binary on a token store (`store:DIR`): a checkpoint written by 2 processes x 4 devices
continues on 1 process x 8 devices (its batches built by 2 worker processes) with the same global
batches, hence the same losses (1e-5), and the store's tokenizer is used when data.tokenizer is empty."""
import json
import shutil

import pytest

from mlm_jax.data.store import prepare
from test_multihost import _multi, _single
from test_train import _losses

STEPS = 6


@pytest.fixture(scope="module")
def store_data(corpus_and_tokenizer, tmp_path_factory):
  corpus, spm = corpus_and_tokenizer
  root = str(tmp_path_factory.mktemp("train_store") / "store")
  prepare.prepare(prepare.Options(sources=(f"docs={corpus}",), tokenizer=spm, eval_percent=5.0), root,
                  progress_s=1e9, log=lambda s: None)
  return root


def test_store_checkpoint_of_two_processes_continues_on_one(tmp_path, store_data):
  two = tmp_path / "two"
  procs = _multi(two, store_data, "--config.mesh.data=8", f"--config.train.save_every={STEPS // 2}", steps=STEPS)
  for q in procs:
    _, err = q.communicate(timeout=600)
    assert q.returncode == 0, err[-3000:]
  losses = _losses(two)
  assert sorted(losses) == list(range(1, STEPS + 1))
  config = json.loads((two / "config.json").read_text())
  assert config["data"]["tokenizer"].startswith(store_data)   # the store's own tokenizer
  last = [json.loads(l) for l in (two / "metrics.jsonl").read_text().splitlines() if '"loss"' in l][-1]
  assert last["data/docs/tokens"] > 0 and 0 < last["data/docs/epochs"] < 1, last
  # the logged share of real tokens of each step (log_every=1) is that of the batch it read, counted
  # here from the store: the global batch's non-padding slots, read by one process
  import ml_collections
  from mlm_jax.data.store import loader
  reader = loader.StorePipeline(ml_collections.ConfigDict(config["data"]), config["train"]["batch_size"],
                                seed=config["seed"], cache_dir=str(tmp_path / "index"))
  logged = {m["step"]: m for m in map(json.loads, (two / "metrics.jsonl").read_text().splitlines()) if "loss" in m}
  for step in range(1, STEPS + 1):
    real = (next(reader)["segment_ids"] > 0).mean()
    assert logged[step]["real_fraction"] == pytest.approx(real, rel=1e-6), (step, logged[step])
    assert logged[step]["real_tokens_per_sec"] / logged[step]["tokens_per_sec"] == pytest.approx(real, rel=1e-6)

  mid = STEPS // 2
  one = tmp_path / "one"
  one.mkdir()
  shutil.copytree(two / "checkpoints" / str(mid), one / "checkpoints" / str(mid))
  p = _single(one, store_data, "--config.mesh.data=4", "--config.mesh.fsdp=2", f"--config.train.save_every={STEPS // 2}",
              "--config.data.store_workers=2", steps=STEPS)   # batches built by worker processes here
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"resuming from step {mid}" in p.stderr
  assert json.loads((one / "config.json").read_text())["data"]["store_workers"] == 2
  resumed = _losses(one)
  for s in range(mid + 1, STEPS + 1):
    assert abs(resumed[s] - losses[s]) <= 1e-5, (s, resumed[s], losses[s])
