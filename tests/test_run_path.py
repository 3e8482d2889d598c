"""One pretraining run's path, as the binary builds it, in a fresh interpreter: the objective is looked up
by name once (in the resolution step), and a streaming-text run imports nothing of the token store."""
import json
import subprocess
import sys

from subproc import REPO, cpu_env

_PROBE = """
import json, sys
from mlm_jax.objectives import registry
calls = []
load = registry.load
registry.load = lambda name: calls.append(name) or load(name)
from mlm_jax import train
from mlm_jax.config.defaults import default_config
from mlm_jax.evaluation import heldout
from mlm_jax.model import sharding
from mlm_jax.training import resolve, trainer as trainer_lib
corpus, tokenizer, workdir = sys.argv[1:]
c = default_config()
c.data.update(sources=(corpus,), tokenizer=tokenizer, seq_len=32)
c.model.update(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
c.train.update(batch_size=4, steps=2)
run = resolve.resolve_pretraining(c, workdir)
t = trainer_lib.make_trainer(run.config, sharding.make_mesh(run.config.mesh), run.objective)
rows = next(train.host_input(run, "train", workdir))
heldout.HeldOut(t, run.tokenizer, train.host_input(run, "eval", workdir))
fpt = run.objective.flops_per_token(run.config, 32, run.config.masking.max_predictions)
print(json.dumps(dict(calls=calls, rows=rows["input_ids"].shape[0], fpt=fpt,
                      store=sorted(m for m in sys.modules if m.startswith("mlm_jax.data.store")))))
"""


def test_the_objective_is_looked_up_once_and_a_text_run_needs_no_store(corpus_and_tokenizer, tmp_path):
  corpus, tokenizer = corpus_and_tokenizer
  out = subprocess.run([sys.executable, "-c", _PROBE, corpus, tokenizer, str(tmp_path / "run")], cwd=REPO,
                       env=cpu_env(), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  got = json.loads(out.stdout.strip().splitlines()[-1])
  assert got["calls"] == ["mlm"], got
  assert got["rows"] == 4 and got["fpt"] > 0
  assert got["store"] == [], got
