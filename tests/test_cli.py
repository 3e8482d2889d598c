"""The runtime tuning the binaries share (mlm_jax/runtime/)."""
import json
import re
import subprocess
import sys

import pytest

from mlm_jax import runtime
from mlm_jax.runtime import log_setup
from subproc import REPO, TEST_XLA_FLAGS, cpu_env

# A jitted function whose two 64 MiB temporaries XLA allocates from its worker threads on every
# call (cheap: 4 GFLOP): the page faults per call show whether that memory went back to the OS.
_PROBE = """
import os, resource
from mlm_jax import runtime
runtime.configure()
runtime.choose_allocator()                 # may re-execute this very program under mimalloc
policy = runtime.memory_policy()
import jax, jax.numpy as jnp

@jax.jit
def f(a, b):
  return jnp.tanh(a @ b) @ b.T      # a @ b and its tanh: two [8192, 2048] temporaries

a = jnp.full((8192, 64), 0.01, jnp.float32)
b = jnp.full((64, 2048), 0.01, jnp.float32)
faults = []
for _ in range(15):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  f(a, b).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(policy, os.getpid(), sorted(faults)[len(faults) // 2])
"""


def _probe(**env):
  p = subprocess.Popen([sys.executable, "-c", _PROBE], env=dict(cpu_env(1), **env), cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  policy, pid, faults = _last_line(p).split()
  assert int(pid) == p.pid          # a re-execution keeps the process (a supervisor's kill still reaches it)
  return policy, float(faults)


def test_cpu_allocator_policies_stop_xla_scratch_refaulting_and_can_be_turned_off():
  """mimalloc by default (a re-execution with it preloaded), glibc keeping freed memory on request,
  and glibc as it comes; the first two must not fault a call's temporaries in again."""
  # mimalloc returns a freed page to the OS once it has gone unused for MIMALLOC_PURGE_DELAY ms; on a
  # loaded machine (the suite's other worker) the gap between two calls can pass the default 100 ms,
  # so the faults are counted with a delay no gap here reaches (the binaries keep a value the user set).
  # The probe reports the median call's faults: a kept heap still grows in its first calls, while the
  # order in which XLA's threads free their blocks settles, and how many calls that takes depends on
  # the machine's load; once settled a call faults nothing, where glibc as it comes faults every call.
  policy, faults_mi = _probe(MIMALLOC_PURGE_DELAY="5000")
  assert policy == "mimalloc"
  policy, faults_kept = _probe(MLM_JAX_MALLOC="glibc")
  assert policy == "glibc-keep"
  policy, faults_off = _probe(MLM_JAX_MALLOC="system")
  assert policy == "system"
  assert _probe(MLM_JAX_KEEP_FREED_MEMORY="0")[0] == "system"   # the older switch still works
  # Without them each call faults its 128 MiB of temporaries in again: 32768 pages of 4 KiB each, or
  # 64 of 2 MiB where transparent huge pages back them; either count is far above the kept heaps'.
  assert faults_off >= 32, f"{faults_off:.0f} faults per call without a kept heap: the probe measures nothing"
  assert faults_kept < 0.5 * faults_off, (faults_kept, faults_off)
  assert faults_mi < 0.5 * faults_off, (faults_mi, faults_off)


# What the console script pip generates for an entry point 'NAME=MODULE:FUNC' does (setup.py's).
_CONSOLE_SCRIPT = """# -*- coding: utf-8 -*-
import re
import sys

import pytest
from {module} import {func}
if __name__ == "__main__":
    import os
    from mlm_jax.runtime import allocator
    print("allocator", allocator.active(), os.environ.get(allocator.ACTIVE), os.getpid(), flush=True)
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({func}())
"""


def _entry_points() -> dict:
  text = (REPO / "setup.py").read_text()
  block = re.search(r'"console_scripts": \[(.*?)\]', text, re.S).group(1)
  return dict(re.findall(r'"([\w-]+)=([\w.]+:\w+)"', block))


def _console(tmp_path, name: str, args: list, **env) -> tuple:
  module, func = _entry_points()[name].split(":")
  script = tmp_path / name
  script.write_text(_CONSOLE_SCRIPT.format(module=module, func=func))
  p = subprocess.Popen([sys.executable, str(script), *args], env=dict(cpu_env(1), **env), cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  out, err = p.communicate(timeout=300)
  line = next(l for l in out.splitlines() if l.startswith("allocator "))
  _, active, marker, pid = line.split()
  assert int(pid) == p.pid
  return active, marker, err


def test_console_scripts_run_under_mimalloc_with_one_re_execution(tmp_path):
  """Each console script is a binary (runtime.PROGRAMS): started as the generated script does it, it
  runs under mimalloc after one re-execution (the marker stops a second); with the marker already set
  it is not re-executed, and without the library it runs on glibc with one warning line."""
  scripts = _entry_points()
  assert sorted(scripts) == sorted(runtime.PROGRAMS.values())
  assert all(runtime.PROGRAMS[target.split(":")[0]] == name for name, target in scripts.items())
  active, marker, _ = _console(tmp_path, "mlm-jax-train", ["--helpshort"])
  assert (active, marker) == ("mimalloc", "1")
  active, marker, _ = _console(tmp_path, "mlm-jax-train", ["--helpshort"], MLM_JAX_MALLOC_ACTIVE="1")
  assert (active, marker) == ("glibc", "1")       # the guard: no re-execution, LD_PRELOAD untouched
  active, marker, err = _console(tmp_path, "mlm-jax-train", ["--helpshort"],
                                 MLM_JAX_MIMALLOC_LIBRARY="/nonexistent/libmimalloc.so")
  assert (active, marker) == ("glibc", "None")
  warned = [l for l in err.splitlines() if "mimalloc" in l]
  assert warned == ["warning: no mimalloc (MLM_JAX_MIMALLOC_LIBRARY='/nonexistent/libmimalloc.so' is no file): "
                    "running on glibc, keeping freed memory; MLM_JAX_MALLOC=glibc silences this"], err[-2000:]


def test_an_unknown_allocator_is_one_line():
  p = subprocess.run([sys.executable, "-m", "mlm_jax.train", "--config=configs/demo.py"], cwd=REPO,
                     env=dict(cpu_env(1), MLM_JAX_MALLOC="tcmalloc"), capture_output=True, text=True, timeout=120)
  assert p.returncode != 0
  assert p.stderr.strip().splitlines()[-1] == ("error: MLM_JAX_MALLOC='tcmalloc': expected one of mimalloc, "
                                                "glibc, system"), p.stderr[-2000:]


# The real train step of a 4-layer model (tools/benchmark.py's), compiled after runtime.configure().
_SCHEDULE_PROBE = """
import json, os, sys
sys.path.insert(0, "tools")
from mlm_jax import runtime
runtime.configure()
import jax, benchmark, benchmark_setup
from mlm_jax.model import sharding
from mlm_jax.training import trainer as step
args = benchmark._parse(["--model=mini", "--batch=8", "--seq_len=64", "--vocab=1000"])
run = benchmark_setup.resolved_run(args, "cpu")[0]
tr = step.make_trainer(run.config, sharding.make_mesh(run.config.mesh, jax.devices()[:1]), run.objective)
compiled = tr.train_step.lower(jax.eval_shape(tr.init), benchmark_setup.random_batches(args)[0], jax.random.key(0), tr.values).compile()
print(json.dumps([os.environ["XLA_FLAGS"], compiled.memory_analysis().temp_size_in_bytes]))
"""


def test_cpu_steps_are_scheduled_for_memory_unless_the_user_says_otherwise():
  """runtime.configure() turns XLA:CPU's concurrency-first scheduler off (runtime.CPU_XLA_FLAGS): the
  compiled step needs fewer temporaries than with it, and an XLA_FLAGS that names the flag is kept."""
  user = "--xla_cpu_enable_concurrency_optimized_scheduler=true"
  envs = [dict(cpu_env(1), JAX_ENABLE_COMPILATION_CACHE="false"),
          dict(cpu_env(1), JAX_ENABLE_COMPILATION_CACHE="false", XLA_FLAGS=user)]
  procs = [subprocess.Popen([sys.executable, "-c", _SCHEDULE_PROBE], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for env in envs]
  (ours_flags, ours), (user_flags, theirs) = [json.loads(_last_line(p)) for p in procs]
  assert ours_flags == f"{TEST_XLA_FLAGS} --xla_cpu_enable_concurrency_optimized_scheduler=false"
  assert user_flags == user
  assert ours < 0.95 * theirs, (ours, theirs)


def _last_line(p: subprocess.Popen) -> str:
  out, err = p.communicate(timeout=300)
  assert p.returncode == 0, err[-2000:]
  return out.strip().splitlines()[-1]


def test_a_failed_checkpoint_writes_unretrieved_futures_are_not_logged():
  """A failed save's futures that nobody awaited are logged by asyncio at exit; the one-line error has said
  it. A write failed in TensorStore's threads has no Python frames (1 run in ~30 printed one, seen in
  test_train's failed-save test); any other unretrieved future is still logged."""
  import logging
  message = ('OUT_OF_RANGE: Error writing "opt_state.mu/0" in OCDBT database at local file '
             '"/w/checkpoints/4.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/": File too large')

  def record(exc):
    return logging.LogRecord("asyncio", logging.ERROR, "/usr/lib/python3.11/asyncio/base_events.py", 1771,
                             "Future exception was never retrieved", None, (type(exc), exc, None))

  assert log_setup._from_orbax(record(ValueError(message)))
  assert not log_setup._from_orbax(record(ValueError("OUT_OF_RANGE: Error writing 'x' in /data/store")))


# What a normal exit does that keeps output, each left for runtime.exit_now to finish: a non-daemon thread
# and a thread pool's task still running (each writes its file after 0.5 s), an atexit handler, text in Python's and
# in C's stdout buffers (a pipe, PYTHONUNBUFFERED unset).
_EXIT_PROBE = """
import atexit, concurrent.futures, ctypes, os, sys, threading, time
from mlm_jax import runtime
out, code = sys.argv[1], eval(sys.argv[2])

def write(name, after_s=0.0):
  time.sleep(after_s)
  with open(os.path.join(out, name), "w") as f:
    f.write(name)

threading.Thread(target=write, args=("thread", 0.5)).start()
concurrent.futures.ThreadPoolExecutor(1).submit(write, "pool", 0.5)
atexit.register(write, "atexit")
print("from python", end=" ")
ctypes.CDLL(None).printf(b"from C")
runtime.exit_now(code)
"""


@pytest.mark.parametrize("code,status", [("None", 0), ("3", 3), ("'error: said in one line'", 1)])
def test_exit_now_keeps_what_a_normal_exit_keeps_and_its_status(tmp_path, code, status):
  """The binaries and tools end with runtime.exit_now, skipping the interpreter's ~2 s teardown: threads
  still working are waited for, atexit handlers run, buffered output reaches the pipe, and the status is
  sys.exit's (a message: printed, 1)."""
  env = {k: v for k, v in cpu_env(1).items() if k != "PYTHONUNBUFFERED"}
  p = subprocess.run([sys.executable, "-c", _EXIT_PROBE, str(tmp_path), code], env=env, cwd=REPO,
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == status, p.stderr[-2000:]
  assert p.stdout == "from python from C"
  assert sorted(f.name for f in tmp_path.iterdir()) == ["atexit", "pool", "thread"]
  assert p.stderr == ("error: said in one line\n" if status == 1 else ""), p.stderr[-2000:]
