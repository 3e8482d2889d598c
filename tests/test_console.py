"""What a new user sees: the demo binary in a user's environment (no JAX_PLATFORMS, no TF_CPP_MIN_LOG_LEVEL),
with libtpu installed (the README's test command installs the [tpu] extra) on a machine without a TPU or GPU."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from subproc import REPO

# Lines the libraries print on such a machine, by what prints them.
NOISE = {
    "libtpu": ("TPU_WORKER_HOSTNAMES", "Failed to find host bounds", "Unable to initialize backend 'tpu'"),
    "cuInit": ("cuInit",),
    "oneDNN": ("oneDNN",),
    "sentencepiece trainer": ("trainer_interface.cc", "normalizer_spec {"),
}
# Whether these print depends on the host, not on us: TensorFlow announces oneDNN only on CPUs it
# enables oneDNN for (not on an AVX2-only EPYC), and cuInit only where CUDA's stub libraries load.
HOST_DEPENDENT = ("cuInit", "oneDNN")


def _demo(workdir, *extra) -> tuple:
  """Starts the demo binary; (the process, the file its stderr goes to)."""
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS",
                                                            "TF_ENABLE_ONEDNN_OPTS")}
  cmd = [sys.executable, "-m", "mlm_jax.train", "--config=configs/demo.py", f"--workdir={workdir}",
         "--config.tokenizer.vocab_size=1000", "--config.tokenizer.input_sentence_size=400",
         "--config.train.steps=2", "--config.train.log_every=1",
         "--config.train.eval_every=2", "--config.train.eval_batches=1", "--config.train.peak_tflops_per_device=0.1",
         *extra]
  path = f"{workdir}.stderr"
  with open(path, "w") as err:   # a file, not a pipe: --verbosity=1 writes megabytes
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err), path


def _stderr(run: tuple) -> str:
  proc, path = run
  proc.wait(timeout=600)
  with open(path) as f:
    err = f.read()
  assert proc.returncode == 0, err[-3000:]
  return err


def _found(stderr: str) -> dict:
  return {name: [l for l in stderr.splitlines() if any(m in l for m in marks)][:2] for name, marks in NOISE.items()}


@pytest.mark.skipif(os.path.exists("/dev/nvidia0") or os.path.exists("/dev/accel0"),
                    reason="the quiet console is for machines without an accelerator")
def test_demo_console_is_quiet_and_verbosity_1_shows_everything(tmp_path):
  if importlib.util.find_spec("libtpu") is None and os.environ.get("CI", "").lower() != "true":
    pytest.skip("libtpu is not installed (pip install -e '.[tpu]')")
  # One after the other: the second run's train and eval steps come from the session's compilation cache
  # (run at once, both compiled them: the suite's other worker keeps both cores busy anyway).
  quiet = _stderr(_demo(tmp_path / "quiet"))
  loud = _stderr(_demo(tmp_path / "loud", "--verbosity=1"))
  assert "step 1/2  loss" in quiet and "step 2  eval loss" in quiet, quiet[-2000:]
  assert "[tokenizer] trained in" in quiet
  assert "CPU allocator: mimalloc" in quiet   # the binary re-executed itself with it (mlm_jax/runtime/allocator.py)
  assert not any(_found(quiet).values()), _found(quiet)
  assert "INVALID_ARGUMENT" not in quiet and "W0000" not in quiet and "E0000" not in quiet
  assert (tmp_path / "quiet" / "tokenizer" / "spm.train.log").read_text().count("trainer_interface.cc") > 10

  assert "step 2  eval loss" in loud
  missing = [name for name, lines in _found(loud).items() if not lines and name not in HOST_DEPENDENT]
  assert not missing, f"--verbosity=1 hides {missing}"


def test_verbosity_1_turns_every_filter_off():
  """What the project controls, on any CPU: the quiet settings are made only without --verbosity=1."""
  probe = ("import json, os, sys; from mlm_jax import runtime; v = runtime.configure(sys.argv[1:]); "
           "print(json.dumps([v] + [os.environ.get(k) for k in "
           "('TF_CPP_MIN_LOG_LEVEL', 'TF_ENABLE_ONEDNN_OPTS', 'JAX_PLATFORMS')]))")
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL",
                                                            "TF_ENABLE_ONEDNN_OPTS")}

  def settings(*argv):
    out = subprocess.run([sys.executable, "-c", probe, *argv], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])

  from mlm_jax import runtime
  cpu = None if runtime.accelerator_present() else "cpu"
  assert settings() == [0, "2", "0", cpu]
  assert settings("--verbosity=1") == [1, "0", None, None]
  assert settings("-v", "2") == [2, "0", None, None]
