"""Ahead-of-time compile of the train step for a TPU (or NVIDIA GPU) topology, from any host: will it fit, how fast?

With libtpu, XLA's TPU compiler compiles the exact step of `trainer.make_trainer` over a described,
unattached slice from abstract inputs (no parameter is materialized) and reports per device memory
against HBM and a cost-model step time. What the figures mean: docs/design_notes.md#aot.
NVIDIA GPUs ('h100:8') compile with the CUDA plugin's compile-only devices (gpu_targets.py); several
slices (`num_slices`) add the collectives that cross the data-center network (hlo_collectives.py).
"""
from __future__ import annotations

import math
import os
import re
import sys
import tempfile
import time

import ml_collections

from mlm_jax import runtime
from mlm_jax.errors import UserError
from mlm_jax.model.flops import GIB


class AotError(UserError):
  """A config or topology problem the user can fix; the tools print it as one line."""


class NotPlaceable(AotError):
  """The step's global batch cannot be split over the mesh's batch axes on this topology: a verdict
  about this config on this slice (like not fitting), not a broken command. `advice` says what would
  place it."""

  def __init__(self, reason: str, advice: str, topology: str):
    super().__init__(f"not placeable on {topology}: {reason}; try {advice}")
    self.reason, self.advice = reason, advice


# Data-center network bandwidth per chip, Gbit/s (Cloud TPU system architecture pages: v5p 50; v5e two
# 100 Gbit/s NICs per 8-chip host). Others: --dcn_gbps.
DCN_GBPS_PER_CHIP = {"TPU v5": 50.0, "TPU v5 lite": 25.0}


def topology_devices(name: str, num_slices: int = 1) -> list:
  """The compile-only devices of a TPU topology such as 'v5p:2x2x2' or 'v5e:4x4'.

  Without an attached TPU, libtpu logs errors about TPU_ACCELERATOR_TYPE and worker hostnames
  while it initializes; they are harmless for compile-only use and are swallowed here (and
  shown if initialization really fails). ALLOW_MULTIPLE_LIBTPU_LOAD lets this run while another
  process (a test, a CPU run that probed libtpu) holds /tmp/libtpu_lockfile.

  NVIDIA GPU topologies ('h100:8', 'h200:2x8': hosts x GPUs) come from the CUDA plugin's
  compile-only devices (gpu_targets.py).
  """
  from mlm_jax.training import gpu_targets
  if gpu_targets.parse(name):
    if num_slices > 1:
      raise AotError(f"--num_slices={num_slices} is for TPU slices; GPU hosts are part of the topology: h100:HOSTSxGPUS")
    try:
      return gpu_targets.devices(name)
    except ImportError:
      raise AotError("the CUDA plugin is not installed: pip install -e '.[gpu]' (jax[cuda12] at jax's version; "
                     "no GPU or driver needed to compile)") from None
  try:
    import libtpu  # noqa: F401
  except ImportError:
    raise AotError("libtpu is not installed: pip install -e '.[tpu]' (jax[tpu] at jax's version)") from None
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies
  with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
    try:
      with runtime.stderr_to(log.name):
        extra = dict(num_slices=num_slices) if num_slices > 1 else {}
        topo = topologies.get_topology_desc(platform="tpu", topology_name=name, **extra)
    except Exception as e:  # noqa: BLE001 - libtpu raises JaxRuntimeError/ValueError variously
      sys.stderr.write(log.read())
      raise AotError(f"--topology={name!r} --num_slices={num_slices}: {' '.join(str(e).split())}") from None
  return list(topo.devices)


def chip_spec(devices) -> tuple[str, int, int, float]:
  """(device kind, devices per chip, HBM bytes per device, peak bf16 FLOP/s per device)."""
  from mlm_jax.model import flops
  kind = devices[0].device_kind
  spec = flops.accelerator_spec(kind)
  if spec is None:
    raise AotError(f"no HBM/peak figures for device kind {kind!r}: known {sorted(flops.ACCELERATORS)}")
  chips = len({(getattr(d, "slice_index", 0), *getattr(d, "coords", (d.id,))) for d in devices})
  per_chip = max(1, len(devices) // max(chips, 1))
  hbm, peak = spec
  return kind, per_chip, hbm // per_chip, peak / per_chip


def abstract_inputs(trainer, config: ml_collections.ConfigDict):
  """(state, batch, key) as ShapeDtypeStructs with the trainer's shardings; nothing is allocated."""
  import jax
  import jax.numpy as jnp
  from mlm_jax.model import sharding
  state = jax.eval_shape(trainer.init)
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       state, trainer.state_sharding)
  features = trainer.description.batch_features(config.data.seq_len)   # NSP / SOP rows add two
  batch = {k: jax.ShapeDtypeStruct((config.train.batch_size, *shape), jnp.int32, sharding=trainer.batch_sharding)
           for k, shape in features.items()}
  key = jax.eval_shape(lambda: jax.random.key(0))
  key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=sharding.replicated(trainer.mesh))
  return state, batch, key


def state_bytes_per_device(state) -> int:
  """Bytes of the train state (params + AdamW moments) one device holds under its shardings."""
  import jax
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(state))


def batch_bytes_per_device(batch) -> int:
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in batch.values())


_SIZE = r"([0-9.]+)\s*([KMGT]i?B?|B)"
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "B": 1}


def _bytes(num: str, unit: str) -> int:
  return int(float(num) * _UNITS[unit[0]])


def parse_oom(message: str) -> tuple[str, int, int] | None:
  """('temporaries' or 'total', bytes needed, bytes available) from XLA TPU's out-of-memory error.

  XLA stops at the first thing that does not fit; when that is the temporaries, the arguments
  come on top of the bytes it names.
  """
  m = re.search(r"required for HLO temporaries \(" + _SIZE + r"\).*?available HBM \(" + _SIZE + r"\)", message,
                re.S)
  if m:
    return "temporaries", _bytes(m.group(1), m.group(2)), _bytes(m.group(3), m.group(4))
  m = re.search(r"Used " + _SIZE + " of " + _SIZE + " hbm", message)
  if m:
    return "total", _bytes(m.group(1), m.group(2)), _bytes(m.group(3), m.group(4))
  return None


def compile_train_step(config: ml_collections.ConfigDict, topology: str, num_slices: int = 1,
                       dcn_gbps: float = 0.0) -> dict:
  """Compile the train step for `num_slices` slices of `topology`; a JSON-ready report (docs/design_notes.md#aot). `dcn_gbps`: DCN bandwidth per chip in Gbit/s (0 = DCN_GBPS_PER_CHIP's figure)."""
  from mlm_jax.model import sharding
  from mlm_jax.objectives import masking
  from mlm_jax.training import resolve, trainer as trainer_lib

  devices = topology_devices(topology, num_slices)
  platform = "gpu" if devices[0].platform in ("gpu", "cuda") else "tpu"
  run = resolve.resolve_for_compile(config, platform)
  config, notes = run.config, list(run.notes)
  kind, per_chip, hbm, peak = chip_spec(devices)
  if platform == "gpu":   # JAX preallocates this share of a GPU's memory (launch/slurm.sbatch: 0.9)
    fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9"))
    hbm = int(hbm * fraction)
    notes.append(f"GPU: {fraction:.2f} of HBM usable (XLA_PYTHON_CLIENT_MEM_FRACTION); XLA:GPU gives no cost "
                 "analysis for a compile-only program: memory and fit, no FLOPs or optimal time")
  try:
    mesh = sharding.make_mesh(config.mesh, devices=devices)
  except ValueError as e:
    raise AotError(f"{e} (on {topology})") from None
  slices = sharding.num_slices(devices)
  b, s = config.train.batch_size, config.data.seq_len
  n = len(devices)
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  if b % shards:
    raise NotPlaceable(f"train.batch_size={b} is not divisible by the batch axes data*fsdp={shards} of the mesh "
                       f"{dict(mesh.shape)}", placement_advice(b, shards), topology)
  if int(config.optimizer.grad_accum_steps) > 1:
    notes.append("optimizer.grad_accum_steps > 1: XLA's cost analysis does not count every iteration of "
                 "the microbatch loop, so its FLOPs, optimal time and the MFU bound are too low")
  slots = masking.max_predictions(config.masking, s, platform)
  model_flops = run.objective.flops_per_token(config, s, slots) * b * s
  report = dict(
      topology=topology, num_slices=slices, device_kind=kind, devices=n, devices_per_chip=per_chip,
      mesh=dict(mesh.shape), dcn_mesh=dict(zip(sharding.AXES, sharding.dcn_shape(config.mesh, tuple(
          mesh.shape.values()), slices))), batch_size=b, seq_len=s, batch_per_device=b // shards, prediction_slots=slots,
      remat=config.model.remat, grad_accum_steps=int(config.optimizer.grad_accum_steps),
      attention_impl=config.model.attention_impl, scan_layers=bool(config.model.scan_layers),
      hbm_bytes=hbm, peak_flops=peak,
      model_flops_per_device=model_flops / n, notes=notes)

  t0 = time.perf_counter()
  trainer = trainer_lib.make_trainer(config, mesh, run.objective)
  state, batch, key = abstract_inputs(trainer, config)
  report["state_bytes"] = state_bytes_per_device(state)
  lowered = trainer.train_step.lower(state, batch, key, trainer.values)
  try:
    compiled = lowered.compile()
  except Exception as e:  # noqa: BLE001 - XLA reports running out of HBM as a compile error
    oom = parse_oom(str(e))
    if oom is None and "RESOURCE_EXHAUSTED" not in str(e):
      raise
    what, need, avail = oom if oom else ("total", 0, hbm)
    if what == "temporaries":   # the state and the batch shard come on top; code is not known
      report["temp_bytes"] = need
      need += report["state_bytes"] + batch_bytes_per_device(batch)
    over = max(need - hbm, report.get("temp_bytes", need) - avail)
    report.update(compile_s=time.perf_counter() - t0, fits=False, total_bytes=need, over_bytes=over,
                  total_is_lower_bound=True, xla_available_bytes=avail,
                  xla_error=" ".join(str(e).split())[:500])
    report["advice"] = advice(report, config)
    return report
  report["compile_s"] = time.perf_counter() - t0

  mem = compiled.memory_analysis()
  args, outs = mem.argument_size_in_bytes, mem.output_size_in_bytes
  alias, temps, code = mem.alias_size_in_bytes, mem.temp_size_in_bytes, mem.generated_code_size_in_bytes
  total = args + outs - alias + temps + code
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
  xla_flops = float(cost.get("flops", 0.0))
  seconds = float(cost.get("optimal_seconds", 0.0))
  if seconds <= 0 and platform == "tpu":   # seen on 12-layer programs: XLA's cost model gives a negative time
    notes.append(f"XLA's cost model gave no step time (optimal_seconds={seconds:.4g}); no MFU bound")
    seconds = 0.0
  if config.model.attention_impl != "xla":
    notes.append(f"{config.model.attention_impl} kernels have no XLA cost estimate: no optimal time or MFU bound")
    seconds = 0.0
  if config.model.scan_layers:
    notes.append("scan_layers: XLA's cost analysis counts the scanned loop body once, so its FLOPs and optimal "
                 "time are too low; no MFU bound")
    seconds = 0.0
  report.update(
      argument_bytes=args, output_bytes=outs, alias_bytes=alias, temp_bytes=temps, code_bytes=code,
      total_bytes=total, fits=total <= hbm, over_bytes=total - hbm,
      xla_flops_per_device=xla_flops, bytes_accessed_per_device=float(cost.get("bytes accessed", 0.0)),
      optimal_seconds=seconds,
      mfu_bound=(model_flops / (seconds * n * peak)) if seconds > 0 else None)
  report.update(dcn_report(compiled, slices, kind, per_chip, dcn_gbps))
  if seconds > 0 and report.get("dcn_seconds") is not None:   # no overlap assumed: an upper estimate
    report["step_seconds_estimate"] = seconds + report["dcn_seconds"]
  if not report["fits"]:
    report["advice"] = advice(report, config)
  return report


def placement_advice(batch: int, shards: int) -> str:
  """The nearest global batches that split over `shards` batch shards, and the tensor axis that would
  leave a data*fsdp dividing `batch` (it applies to the whole run: the mesh is the run's)."""
  lower, upper = batch // shards * shards, (batch // shards + 1) * shards
  sizes = " or ".join(f"--config.train.batch_size={x}" for x in (lower, upper) if x > 0)
  tips = [f"{sizes} (a multiple of {shards}; in a run in phases, that phase's train.batch_size)"]
  tensor = shards // math.gcd(batch, shards)
  if tensor < shards:
    tips.append(f"--config.mesh.tensor={tensor} (data*fsdp={shards // tensor} divides {batch})")
  return "; ".join(tips)


def dcn_report(compiled, slices: int, kind: str, per_chip: int, dcn_gbps: float = 0.0) -> dict:
  """The compiled program's collectives by kind, those crossing slices, and the DCN seconds per step."""
  from mlm_jax.training import hlo_collectives
  found = hlo_collectives.summary(compiled.as_text(), slices)
  out = dict(collectives=found["by_kind"], cross_slice_collectives=found["cross_slice"],
             dcn_bytes_per_device=found["dcn_bytes"])
  if slices > 1:
    gbps = dcn_gbps or DCN_GBPS_PER_CHIP.get(kind, 0.0)
    out["dcn_gbps_per_chip"] = gbps
    out["dcn_seconds"] = found["dcn_bytes"] * 8 / (gbps * 1e9 / per_chip) if gbps else None
  return out


def advice(report: dict, config: ml_collections.ConfigDict) -> str:
  """What would bring the step under HBM, most effective first.

  Temporaries (activations and gradients) scale with the per-device batch; parameters and AdamW
  state (~16 bytes per fp32 parameter) shrink only with more fsdp sharding.
  """
  tips = []
  over = report["total_bytes"] / max(report["hbm_bytes"], 1)
  per_dev = report["batch_per_device"]
  if per_dev > 1:
    k = 2 ** math.ceil(math.log2(max(over, 1.0) * 1.25))
    k = min(k, per_dev)
    accum = report["grad_accum_steps"] * k
    tips.append(f"a smaller per-chip batch (now {per_dev}): --config.optimizer.grad_accum_steps={accum} "
                f"keeps the global batch, or --config.train.batch_size={report['batch_size'] // k}")
  if config.model.remat == "none":
    tips.append("--config.model.remat=full (or dots) to recompute activations in the backward pass")
  state, hbm = report["state_bytes"], report["hbm_bytes"]
  if state > hbm / 10:   # only worth it when the state is a real share of HBM
    if report["mesh"]["fsdp"] < report["devices"]:
      tips.append(f"more fsdp: --config.mesh.fsdp=-1 --config.mesh.data=1 (params + AdamW state are "
                  f"{state / GIB:.1f} GiB per chip now)")
    else:
      tips.append(f"a larger slice: params + AdamW state alone are {state / GIB:.1f} GiB per chip")
  return "; ".join(tips)


def summary_line(report: dict, config_name: str = "") -> str:
  """The one-line verdict: fits with how much headroom, over by how much and what would help, or not
  placeable on this topology (why, and what would place it)."""
  gib = lambda x: f"{x / GIB:.2f} GiB"
  topology = (f"{report['num_slices']} x " if report.get("num_slices", 1) > 1 else "") + report["topology"]
  where = f"{config_name} on {topology}" if config_name else topology
  if not report.get("placeable", True):
    return f"not placeable on this topology: {where}: {report['reason']}; try {report['advice']}"
  if report["fits"]:
    return (f"fits: {where} needs {gib(report['total_bytes'])} per device of {gib(report['hbm_bytes'])} HBM "
            f"({gib(report['hbm_bytes'] - report['total_bytes'])} free)")
  over = report["over_bytes"]
  least = "at least " if report.get("total_is_lower_bound") else ""
  return (f"does not fit: {where} needs {least}{gib(report['total_bytes'])} per device of "
          f"{gib(report['hbm_bytes'])} HBM (over by {gib(over)}); try {report.get('advice') or 'a larger slice'}")


def format_text(report: dict, config_name: str = "") -> str:
  gib = lambda x: f"{x / GIB:8.2f} GiB"
  mesh = " ".join(f"{k}={v}" for k, v in report["mesh"].items())
  topology = (f"{report['num_slices']} x " if report.get("num_slices", 1) > 1 else "") + report["topology"]
  lines = [f"{config_name or 'config'} on {topology}: {report['devices']} x {report['device_kind']}"
           f" ({report['devices_per_chip']} device(s) per chip), mesh {mesh}",
           f"  batch {report['batch_size']} x {report['seq_len']} ({report['batch_per_device']} per device), "
           f"{report['prediction_slots']} prediction slots, remat={report['remat']}, "
           f"grad_accum_steps={report['grad_accum_steps']}, attention={report.get('attention_impl', 'xla')}, "
           f"scan_layers={report.get('scan_layers', False)}, compiled in {report['compile_s']:.0f} s"]
  lines += [f"  note: {n}" for n in report["notes"]]
  if report.get("num_slices", 1) > 1:
    dcn = " ".join(f"{k}={v}" for k, v in report["dcn_mesh"].items())
    lines.append(f"  {report['num_slices']} slices, axes across slices (DCN): {dcn}")
  if "argument_bytes" in report:
    lines += ["  per device:",
              f"    arguments    {gib(report['argument_bytes'])}  (params + AdamW state "
              f"{gib(report['state_bytes']).strip()}, batch)",
              f"    outputs      {gib(report['output_bytes'])}  ({gib(report['alias_bytes']).strip()} aliased "
              "to the donated state)",
              f"    temporaries  {gib(report['temp_bytes'])}  (activations, gradients)",
              f"    code         {gib(report['code_bytes'])}",
              f"    total        {gib(report['total_bytes'])}  of {gib(report['hbm_bytes']).strip()} HBM "
              f"({100 * report['total_bytes'] / report['hbm_bytes']:.0f}%)",
              (f"  step FLOPs per device: XLA {report['xla_flops_per_device']:.4g}, flops.py "
               f"{report['model_flops_per_device']:.4g} "
               f"(ratio {report['xla_flops_per_device'] / report['model_flops_per_device']:.3f})"
               if report["xla_flops_per_device"] else
               f"  step FLOPs per device: flops.py {report['model_flops_per_device']:.4g} (XLA: n/a)"),
              (f"  XLA optimal time {1e3 * report['optimal_seconds']:.2f} ms/step -> MFU bound "
               f"{100 * report['mfu_bound']:.1f}% (peak {report['peak_flops'] / 1e12:.0f} TFLOP/s per device)"
               if report["mfu_bound"] else "  XLA optimal time: n/a")]
    if report.get("step_seconds_estimate"):
      lines.append(f"  step estimate {1e3 * report['step_seconds_estimate']:.2f} ms = XLA optimal time + DCN time "
                   "(no overlap: an upper estimate of this bound)")
    lines += collective_lines(report)
  else:
    lines.append(f"  XLA: {report['xla_error']}")
  lines.append(summary_line(report, config_name))
  return "\n".join(lines)


def collective_lines(report: dict) -> list[str]:
  """The collectives of the compiled step; on several slices those crossing the DCN and their time."""
  kinds = report.get("collectives") or {}
  if not kinds:
    return ["  collectives: none"]
  multi = report.get("num_slices", 1) > 1
  mib = lambda x: f"{x / 2**20:.1f} MiB"
  parts = [f"{k} {v['count']} ({mib(v['bytes'])})" for k, v in kinds.items() if v["count"]]
  where = "" if report["device_kind"].startswith("NVIDIA") else " inside a slice (ICI)"
  lines = [f"  collectives{where}: " + (", ".join(parts) or "none")]
  if multi:
    parts = [f"{k} {v['cross_slice']} ({mib(v['dcn_payload_bytes'])})" for k, v in kinds.items() if v["cross_slice"]]
    lines.append("  collectives across slices (DCN): " + (", ".join(parts) or "none"))
  if multi:
    mb = report["dcn_bytes_per_device"] / 2**20
    if report.get("dcn_seconds") is not None:
      lines.append(f"  DCN per step: {mb:.1f} MiB sent per device -> {1e3 * report['dcn_seconds']:.1f} ms at "
                   f"{report['dcn_gbps_per_chip']:.0f} Gbit/s per chip (ring estimate, before overlap with compute)")
    else:
      lines.append(f"  DCN per step: {mb:.1f} MiB sent per device (no DCN bandwidth known for "
                   f"{report['device_kind']}: --dcn_gbps)")
  return lines


TABLE_HEADER = ("| config | topology | mesh d/f/t | batch/chip | params+opt GiB | temps GiB | total / HBM GiB "
                "| fits | XLA TFLOP | flops.py TFLOP | optimal ms | MFU bound | attention | scan | compile s |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


MULTISLICE_HEADER = ("| config | slices x topology | mesh d/f/t | DCN d/f/t | batch/chip | total / HBM GiB | fits "
                     "| collectives ICI/DCN | DCN MiB/chip | DCN ms | optimal ms | compile s |\n"
                     "|---|---|---|---|---|---|---|---|---|---|---|---|")


def multislice_row(report: dict) -> str:
  """One markdown row of the multi-slice table from a report (as written by `--json`)."""
  if not report.get("placeable", True):
    return _unplaced_row(report, MULTISLICE_HEADER)
  axes = ("data", "fsdp", "tensor")
  total = ("≥ " if report.get("total_is_lower_bound") else "") + f"{report['total_bytes'] / GIB:.1f}"
  kinds = report.get("collectives") or {}
  coll = ", ".join(f"{k} {v['count']}/{v['cross_slice']}" for k, v in kinds.items())
  dcn_ms = report.get("dcn_seconds")
  cells = [_config_cell(report), f"{report.get('num_slices', 1)} x `{report['topology']}`",
           "/".join(str(report["mesh"][a]) for a in axes),
           "/".join(str(report.get("dcn_mesh", {}).get(a, 1)) for a in axes), str(report["batch_per_device"]),
           f"{total} / {report['hbm_bytes'] / GIB:.1f}", "yes" if report["fits"] else "**no**", coll,
           f"{report['dcn_bytes_per_device'] / 2**20:.0f}" if "dcn_bytes_per_device" in report else "",
           f"{1e3 * dcn_ms:.0f}" if dcn_ms is not None else "",
           f"{1e3 * report['optimal_seconds']:.0f}" if report.get("optimal_seconds") else "",
           f"{report['compile_s']:.0f}"]
  return "| " + " | ".join(cells) + " |"


def _config_cell(report: dict) -> str:
  return report.get("config", "") + (f" [{report['phase']}]" if report.get("phase") else "")


def _unplaced_row(report: dict, header: str) -> str:
  """A row for a step that cannot be placed on the topology: the verdict in the `fits` column."""
  names = [c.strip() for c in header.splitlines()[0].strip("|").split("|")]
  topology = (f"{report.get('num_slices', 1)} x " if "slices" in names[1] else "") + f"`{report['topology']}`"
  cells = {"config": _config_cell(report), names[1]: topology, "fits": "**not placeable**"}
  return "| " + " | ".join(cells.get(n, "") for n in names) + " |"


def table_row(report: dict) -> str:
  """One markdown row from a report (as written by `--json`)."""
  if not report.get("placeable", True):
    return _unplaced_row(report, TABLE_HEADER)
  g = lambda x: f"{x / GIB:.1f}"
  mesh = "/".join(str(report["mesh"][a]) for a in ("data", "fsdp", "tensor"))
  compiled = "argument_bytes" in report   # else XLA refused it: only temporaries (maybe) are known
  total = ("≥ " if report.get("total_is_lower_bound") else "") + g(report["total_bytes"])
  temps = g(report["temp_bytes"]) if "temp_bytes" in report else "?"
  cells = [_config_cell(report), f"`{report['topology']}`", mesh, str(report["batch_per_device"]),
           g(report["state_bytes"]), temps, f"{total} / {g(report['hbm_bytes'])}",
           "yes" if report["fits"] else "**no**",
           f"{report['xla_flops_per_device'] / 1e12:.2f}" if compiled and not report.get("scan_layers")
           and report.get("xla_flops_per_device") else "",
           f"{report['model_flops_per_device'] / 1e12:.2f}",
           f"{1e3 * report['optimal_seconds']:.0f}" if compiled and report["optimal_seconds"] > 0 else "",
           f"{100 * report['mfu_bound']:.0f}%" if compiled and report.get("mfu_bound") else "",
           report.get("attention_impl", "xla"), "on" if report.get("scan_layers") else "off",
           f"{report['compile_s']:.0f}"]
  return "| " + " | ".join(cells) + " |"


def config_name(path: str) -> str:
  return os.path.splitext(os.path.basename(path.split(":")[0]))[0]

