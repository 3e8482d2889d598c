"""Profiles of a real run (`train.profile_steps`) and the tool that summarizes them, on a CPU trace.

One 5-step demo run asks for steps 1-2: step 1 compiles, so steps 2-3 are traced; the tool must
find them in WORKDIR/tensorboard/plugins/profile and report the XLA:CPU ops and the two steps.
Fine-tuning's profile is checked in tests/test_finetune.py (the same loop).
"""
import json
import subprocess
import sys

import pytest

from subproc import REPO, cpu_env

from test_train import _cmd, _losses


def _tool(*args):
  return subprocess.run([sys.executable, "tools/profile_summary.py", *args], cwd=REPO, env=cpu_env(),
                        capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory, corpus_and_tokenizer):
  wd = tmp_path_factory.mktemp("profile") / "run"
  p = subprocess.run(_cmd(wd, corpus_and_tokenizer, "--config.train.profile_steps=(1,2)", steps=5), cwd=REPO,
                     env=cpu_env(), capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-3000:]
  return wd, p.stderr


def test_the_trace_skips_the_compiling_step_and_lands_where_tensorboard_reads_it(profiled_run):
  wd, stderr = profiled_run
  assert "step 1 compiles the train step; profiling steps 2..3" in stderr
  traces = list((wd / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 10_000
  assert sorted(_losses(wd)) == [1, 2, 3, 4, 5]   # the run itself went on to the end


def test_the_tool_lists_top_operations_and_the_step_breakdown(profiled_run):
  wd, _ = profiled_run
  p = _tool(f"--workdir={wd}", "--json", "--top=10")
  assert p.returncode == 0, p.stderr[-3000:]
  s = json.loads(p.stdout)
  assert s["device"] == "/host:CPU" and len(s["ops"]) == 10 and s["distinct_ops"] > 50
  shares = [o["share"] for o in s["ops"]]
  assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1.0
  assert all(o["count"] % 2 == 0 for o in s["ops"]), s["ops"]   # each op of the step ran once per traced step
  assert [st["step"] for st in s["steps"]] == [2, 3]
  for st in s["steps"]:
    assert st["executions"] == 1 and 0 < st["busy_ms"] <= st["device_ms"] <= st["period_ms"], st
    assert 0 < st["input_ms"] <= st["host_ms"], st
  text = _tool(f"--workdir={wd}").stdout
  assert "top operations by self time:" in text and "step breakdown (ms)" in text
  assert [l.split()[0] for l in text.splitlines()[-3:]] == ["2", "3", "mean"]


def test_no_profile_is_one_line(tmp_path):
  p = _tool(f"--workdir={tmp_path}")
  assert p.returncode == 2 and p.stderr.startswith("error: ") and "profile_steps" in p.stderr
  assert len(p.stderr.strip().splitlines()) == 1


def test_profile_window():
  import ml_collections
  from mlm_jax.config.defaults import loop_defaults
  from mlm_jax.errors import ConfigError
  from mlm_jax.training import profiling
  assert loop_defaults().profile_steps == ()   # off by default
  t = lambda spec: ml_collections.ConfigDict(dict(profile_steps=spec))
  assert profiling.window(t(()), 0) is None
  assert profiling.window(t((10, 5)), 0) == (10, 14)
  assert profiling.window(t((0, 3)), 0) == (2, 4)       # the steps after this process's compiling one
  assert profiling.window(t((10, 5)), 11) == (13, 17)   # resumed inside the window: after its first step
  assert profiling.window(t((10, 5)), 20) is None       # resumed past it
  with pytest.raises(ConfigError, match="expected .first step, number of steps."):
    profiling.window(t((10,)), 0)
