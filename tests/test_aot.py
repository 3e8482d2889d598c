"""Ahead-of-time compile of the real train step for a TPU topology, on this CPU (tools/aot_compile.py).

libtpu (the `[tpu]` extra) lets XLA's TPU compiler run without a TPU. The tool runs in a
subprocess so that libtpu is never loaded into the pytest process. Four compiles in all (about two
minutes of CPU): a tiny model that fits on v5p:2x2x2 with every mesh axis 2, the same on two slices of
v5e:2x2, and two phases of a phased run; and one with an absurd batch that does not fit on v5e:2x2
(XLA refuses it early, in a few seconds).
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from subproc import REPO

from mlm_jax.config import phases as phases_lib
from mlm_jax.training import aot


# A hidden-256, 4-head, vocab-32000 encoder at seq 128, 1 layer, on top of configs/demo.py with
# every field the assertions depend on set here (the demo's own sizes change with its recipe).
# TPU compile time on 2 cores is mostly a per-program constant, but a second layer adds ~20% to it.
TINY = ["--config=configs/demo.py", "--config.model.vocab_size=32000", "--config.model.hidden_size=256",
        "--config.model.num_heads=4", "--config.model.intermediate_size=1024", "--config.model.num_layers=1",
        "--config.model.dtype=bfloat16", "--config.data.seq_len=128", "--config.model.max_position_embeddings=130",
        "--config.masking.max_predictions=0", "--config.masking.mask_rate=0.15", "--config.optimizer.grad_accum_steps=1",
        "--config.model.attention_impl=xla"]   # XLA cost analysis (FLOPs, optimal time) covers the xla path only


@pytest.fixture(scope="module", autouse=True)
def _libtpu():
  """Skip without libtpu, except under CI=true, which installs '.[tpu]' and must really run these."""
  if importlib.util.find_spec("libtpu") is None:
    msg = "libtpu not installed: pip install -e '.[tpu]'"
    if os.environ.get("CI", "").lower() == "true":
      pytest.fail(msg)
    pytest.skip(msg)


def _tool(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.run([sys.executable, "tools/aot_compile.py", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def fit_report():
  p = _tool(*TINY, "--topology=v5p:2x2x2", "--config.train.batch_size=64", "--config.mesh.data=2",
            "--config.mesh.fsdp=2", "--config.mesh.tensor=2", "--json")
  assert p.returncode == 0, p.stdout + p.stderr[-3000:]
  lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
  assert len(lines) == 1, p.stdout
  return json.loads(lines[0])


def test_tiny_model_fits_on_v5p_with_data_fsdp_and_tensor_axes(fit_report):
  r = fit_report
  assert r["device_kind"] == "TPU v5" and r["devices"] == 8
  assert r["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
  assert r["batch_per_device"] == 16 and r["prediction_slots"] == 20   # exact on TPU (masking.SLOT_MULTIPLE)
  assert r["attention_impl"] == "xla" and r["scan_layers"] is False and r["compile_s"] > 0
  assert r["fits"] and 0 < r["total_bytes"] < r["hbm_bytes"] == 95 * aot.GIB
  assert r["total_bytes"] == (r["argument_bytes"] + r["output_bytes"] - r["alias_bytes"] + r["temp_bytes"]
                              + r["code_bytes"])
  # The donated state is aliased to the new state, and the arguments hold the sharded state.
  assert r["alias_bytes"] >= r["state_bytes"] > 0 and r["argument_bytes"] >= r["state_bytes"]
  assert r["optimal_seconds"] > 0 and 0 < r["mfu_bound"] < 1
  assert any("mask_id" in n for n in r["notes"])   # demo takes mask ids from the tokenizer: assumed


def test_xla_flops_match_flops_py_within_15_percent(fit_report):
  """Both sides are FLOPs of one whole train step on ONE device.

  XLA: `compiled.cost_analysis()["flops"]` of the SPMD-partitioned program, which is per device.
  flops.py: flops_per_token(model, seq_len, prediction slots) * batch * seq_len is the global count
  for the step; divided by the 8 devices. flops.py counts matmuls only (6 per parameter per token,
  attention scores, the MLM head on the 20 gathered slots); XLA's total also has masking, softmax,
  LayerNorm, GELU, dropout hashing, AdamW and work replicated over the tensor axis, a few percent
  here, so XLA's number is expected at or a little above flops.py's.
  """
  ratio = fit_report["xla_flops_per_device"] / fit_report["model_flops_per_device"]
  assert 0.85 <= ratio <= 1.15, ratio


def test_table_renders_from_json_lines(fit_report, tmp_path):
  path = tmp_path / "fit.jsonl"
  path.write_text(json.dumps(fit_report) + "\n")
  p = _tool(f"--table={path}")
  assert p.returncode == 0, p.stderr[-2000:]
  header, rule, row = p.stdout.strip().splitlines()
  assert header.startswith("| config | topology |") and rule.startswith("|---|")
  assert row.startswith("| demo | `v5p:2x2x2` | 2/2/2 | 16 |") and "| yes |" in row
  assert row.endswith(f"| xla | off | {fit_report['compile_s']:.0f} |")


def test_absurd_batch_exits_1_with_one_line_verdict():
  p = _tool(*TINY, "--topology=v5e:2x2", "--config.train.batch_size=65536")
  assert p.returncode == 1, p.stdout + p.stderr[-3000:]
  verdict = [line for line in p.stderr.splitlines() if line.startswith("does not fit:")]
  assert len(verdict) == 1, p.stderr[-3000:]
  line = verdict[0]
  assert "demo on v5e:2x2 needs at least" in line and "over by" in line and "GiB" in line
  assert "grad_accum_steps=" in line and "model.remat=full" in line
  assert "does not fit:" in p.stdout   # the text report ends with the same verdict


def test_parse_oom_reads_both_xla_messages():
  gib = lambda x: int(x * aot.GIB)
  assert aot.parse_oom("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
                       "temporaries (48.80G) exceeds available HBM (15.75G).") == (
                           "temporaries", gib(48.80), gib(15.75))
  assert aot.parse_oom("Ran out of memory in memory space hbm. Used 20.50G of 15.48G hbm. Exceeded hbm "
                       "capacity by 5.02G.") == ("total", gib(20.5), gib(15.48))
  assert aot.parse_oom("INTERNAL: something else") is None


def test_two_slices_put_data_across_the_dcn_and_name_the_collectives_that_cross_it(tmp_path):
  """2 x v5e:2x2 (8 chips in 2 slices): the default dcn_data=-1 puts the data axis across slices, so the
  gradient all-reduce crosses the DCN (about the parameters' bytes per device: fsdp x tensor shard them
  inside a slice) while fsdp and tensor traffic stays on ICI."""
  p = _tool(*TINY, "--topology=v5e:2x2", "--num_slices=2", "--config.train.batch_size=64", "--config.mesh.data=2",
            "--config.mesh.fsdp=2", "--config.mesh.tensor=2", "--json")
  assert p.returncode == 0, p.stdout + p.stderr[-3000:]
  r = json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][0])
  assert r["num_slices"] == 2 and r["devices"] == 8 and r["devices_per_chip"] == 1
  assert r["dcn_mesh"] == {"data": 2, "fsdp": 1, "tensor": 1} and r["fits"]
  dcn = {k: v for k, v in r["collectives"].items() if v["cross_slice"]}
  assert "all-reduce" in dcn, r["collectives"]
  params_bytes = r["state_bytes"] / 3   # fp32 params + AdamW mu and nu, sharded alike
  assert 0.5 * params_bytes < dcn["all-reduce"]["dcn_payload_bytes"] < 2 * params_bytes, (dcn, params_bytes)
  assert r["collectives"]["all-gather"]["count"] > 0   # fsdp's parameter gathers, inside a slice
  assert r["dcn_gbps_per_chip"] == 25.0 and r["dcn_seconds"] == pytest.approx(
      r["dcn_bytes_per_device"] * 8 / 25e9)
  (tmp_path / "fit.jsonl").write_text(json.dumps(r) + "\n")
  text = _tool(f"--table={tmp_path / 'fit.jsonl'}").stdout
  assert "| demo | 2 x `v5e:2x2` | 2/2/2 | 2/1/1 |" in text, text



def test_a_run_in_phases_reports_every_phase_and_goes_on_after_one_that_cannot_be_placed():
  """configs/demo.py:phases: one fit report per phase, at that phase's sequence length; a phase whose batch
  does not split over the 4 chips of v5e:2x2 is reported as not placeable (why, what would place it), and
  the phase after it is still compiled; the summary names every phase. And the phased
  configs/modernbert_base.py splits into its six phases' shapes (compiled per phase the same way)."""
  spec = importlib.util.spec_from_file_location("modernbert_base", REPO / "configs" / "modernbert_base.py")
  recipe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(recipe)
  shapes = [(name, c.train.batch_size, c.data.seq_len, c.model.rope_theta)
            for name, c in phases_lib.each_phase(recipe.get_config())]
  assert shapes == [("batch768", 768, 1024, 1e4), ("batch1536", 1536, 1024, 1e4), ("batch3072", 3072, 1024, 1e4),
                    ("pretrain", 4608, 1024, 1e4), ("extend", 512, 8192, 1.6e5), ("decay", 512, 8192, 1.6e5)]
  assert all(b % 256 == 0 for _, b, _, _ in shapes)   # every phase splits over slices of up to 256 chips
  args = [a.replace("configs/demo.py", "configs/demo.py:phases") for a in TINY if "seq_len" not in a]
  phases = ("({'name':'pretrain','end_step':4},{'name':'extend','end_step':8,'data.seq_len':64,"
            "'train.batch_size':18},{'name':'decay','end_step':12,'train.batch_size':16})")
  p = _tool(*args, "--topology=v5e:2x2", "--config.train.batch_size=16",
            f"--config.phases={phases}")
  assert p.returncode == 1, p.stdout + p.stderr[-3000:]
  assert "demo [pretrain] on v5e:2x2: 4 x TPU v5 lite" in p.stdout and "batch 16 x 32 (4 per device)" in p.stdout
  assert "demo [decay] on v5e:2x2: 4 x TPU v5 lite" in p.stdout and "batch 16 x 64 (4 per device)" in p.stdout
  summary = p.stdout.split("\nsummary:\n")[1].strip().splitlines()
  assert [line.split(":")[0].strip() for line in summary] == ["fits", "not placeable on this topology", "fits"], summary
  unplaced = ("not placeable on this topology: demo [extend] on v5e:2x2: train.batch_size=18 is not divisible by "
              "the batch axes data*fsdp=4")
  assert summary[1].strip().startswith(unplaced), summary
  assert "--config.train.batch_size=16 or --config.train.batch_size=20" in summary[1]
  assert "--config.mesh.tensor=2 (data*fsdp=2 divides 18)" in summary[1]
  assert [line for line in p.stderr.splitlines() if line.startswith("not placeable")] == [summary[1].strip()]


def test_table_rows_of_a_phase_that_cannot_be_placed():
  r = dict(config="modernbert_base", phase="extend", topology="v5p:4x4x8", num_slices=1, fits=False, placeable=False,
           reason="train.batch_size=576 is not divisible by ...", advice="...")
  row = aot.table_row(r)
  assert row.startswith("| modernbert_base [extend] | `v5p:4x4x8` |") and "| **not placeable** |" in row
  assert row.count("|") == aot.TABLE_HEADER.splitlines()[0].count("|")
  row = aot.multislice_row(dict(r, num_slices=2))
  assert row.startswith("| modernbert_base [extend] | 2 x `v5p:4x4x8` |") and "| **not placeable** |" in row
  assert row.count("|") == aot.MULTISLICE_HEADER.splitlines()[0].count("|")
