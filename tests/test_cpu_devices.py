"""config.cpu_devices: the training binary splits its CPU into that many JAX devices and trains the same steps."""
import json
import re
import subprocess
import sys

import pytest

from mlm_jax import runtime
from mlm_jax.errors import ConfigError
from subproc import REPO, cpu_env


def _demo(workdir, data, *extra) -> str:
  """The demo recipe on the session's corpus and tokenizer (the same for both runs, so that they differ only in
  their devices)."""
  corpus, spm = data
  cmd = [sys.executable, "-m", "mlm_jax.train", "--config=configs/demo.py", f"--workdir={workdir}",
         "--config.demo_corpus=False", f"--config.data.sources=('docs={corpus}',)", f"--config.data.tokenizer={spm}",
         "--config.train.steps=3", "--config.train.log_every=1",
         "--config.train.eval_every=3", "--config.train.eval_batches=1", "--config.train.save_every=3", *extra]
  p = subprocess.run(cmd, cwd=REPO, env=cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                     timeout=600)
  assert p.returncode == 0, p.stdout[-3000:]
  return p.stdout


def test_two_cpu_devices_shard_the_batch_and_train_the_same_steps(tmp_path, corpus_and_tokenizer):
  one = _demo(tmp_path / "one", corpus_and_tokenizer)
  two = _demo(tmp_path / "two", corpus_and_tokenizer, "--config.cpu_devices=2")
  meshes = [re.search(r"mesh \{'data': (\d+)", log).group(1) for log in (one, two)]
  assert meshes == ["1", "2"], meshes
  # the binary re-executes itself under mimalloc; its schedule is still the one for several devices
  assert "CPU: 2 JAX devices, XLA's concurrency-optimized schedule" in two, two[:3000]
  losses = [[float(x) for x in re.findall(r"step \d+/3  loss ([0-9.]+)", log)] for log in (one, two)]
  assert len(losses[0]) == 3 and len(losses[1]) == 3, losses
  # one device or two: the same masks and batches (a function of the example's index), the sums in another order
  assert losses[1] == pytest.approx(losses[0], rel=1e-4), losses
  evals = [float(re.search(r"eval loss ([0-9.]+)", log).group(1)) for log in (one, two)]
  assert evals[1] == pytest.approx(evals[0], rel=1e-4), evals


_FLAGS = """
import os
from mlm_jax import runtime
runtime.use_cpu_devices({n})
import jax
print(jax.device_count(), os.environ["XLA_FLAGS"])
"""


_TRUE = "--xla_cpu_enable_concurrency_optimized_scheduler=true"


@pytest.mark.parametrize("n,user_flags,ours,want", [
    (2, "", False, "concurrency_optimized_scheduler=true"),
    (1, "", False, "concurrency_optimized_scheduler=false"),
    (2, "--xla_cpu_enable_concurrency_optimized_scheduler=false", False, "concurrency_optimized_scheduler=false"),
    (1, _TRUE, False, "concurrency_optimized_scheduler=true"),
    # started by a process of ours that ran two devices: our flag is made afresh for this one
    (1, _TRUE, True, "concurrency_optimized_scheduler=false")])
def test_several_cpu_devices_get_xlas_concurrency_schedule_unless_xla_flags_name_it(n, user_flags, ours, want):
  env = cpu_env()
  env.pop(runtime.environment.ADDED_ENV, None)
  if user_flags:
    env["XLA_FLAGS"] = user_flags
  if ours:
    env[runtime.environment.ADDED_ENV] = json.dumps({"xla_flags": user_flags, "added": [user_flags]})
  p = subprocess.run([sys.executable, "-c", _FLAGS.format(n=n)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True, timeout=300)
  assert p.returncode == 0, p.stdout[-2000:]
  count, flags = p.stdout.strip().splitlines()[-1].split(" ", 1)
  assert int(count) == n and want in flags and flags.count("concurrency_optimized_scheduler") == 1, p.stdout


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_a_bad_cpu_devices_value_is_one_line(value):
  with pytest.raises(ConfigError, match=r"config\.cpu_devices=.*expected 0 \(JAX's default\)"):
    runtime.use_cpu_devices(value)


def test_cpu_devices_after_the_backend_started_says_so():
  import jax
  jax.devices()   # the test process's backend (8 fake devices, conftest.py)
  with pytest.raises(ConfigError, match=r"config\.cpu_devices=3: .*before"):
    runtime.use_cpu_devices(3)


def test_mfu_on_the_cpu_is_against_its_one_peak_however_many_devices_share_it(monkeypatch):
  """The matmul peak measured on one CPU device is the process's (its devices share its threads): MFU's
  denominator is not multiplied by the devices; a peak given per device still is."""
  import jax
  from mlm_jax.config.defaults import default_config
  from mlm_jax.model import flops
  monkeypatch.setattr(flops, "measure_matmul_peak", lambda **kw: 1e11)   # the timing, not what is tested
  c = default_config()
  assert jax.device_count() == 8 and flops.peak_flops(c) == 1e11
  c.train.peak_tflops_per_device = 0.5
  assert flops.peak_flops(c) == pytest.approx(0.5e12 * 8)
