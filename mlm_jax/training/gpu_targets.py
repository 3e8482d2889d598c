"""Compile-only NVIDIA GPU topologies for the AOT tool: `--topology=h100:8` (one host of 8) or `h200:2x8`.

The CUDA PJRT plugin (`pip install -e '.[gpu]'`, i.e. jax[cuda12]; no GPU or driver needed) builds
compile-only devices from a GpuTargetConfig text proto, the description of the device that XLA's
GPU compiler would otherwise read from an attached GPU. The figures below are NVIDIA's published
ones for the SXM parts (SM count, shared memory and registers per SM, L2, HBM size and
bandwidth, clock); the compiler uses them to tile and fuse, so the program is the one a real
H100/H200 host compiles, up to autotuning (which needs the device: compile-only takes default
kernel configs).
"""
from __future__ import annotations

import re

_COMMON = """
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 minor: 0 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
"""

# name -> (device memory bytes, memory bandwidth bytes/s, device description)
GPUS = {
    "h100": (80 * 2**30, 3.35e12, "NVIDIA H100 80GB HBM3"),
    "h200": (141 * 10**9, 4.8e12, "NVIDIA H200"),
}


def target_config(name: str) -> str:
  memory, bandwidth, description = GPUS[name]
  return (f"gpu_device_info {{{_COMMON}  device_memory_size: {memory}\n  memory_bandwidth: {int(bandwidth)}\n}}\n"
          f'runtime_version {{ major: 12 minor: 8 }}\nplatform_name: "CUDA"\ndnn_version_info {{ major: 9 minor: 8 }}\n'
          f'device_description_str: "{description}"\n')


def parse(topology: str) -> tuple[str, int, int] | None:
  """('h100', hosts, gpus per host) for 'h100:8' or 'h100:2x8'; None for anything else (a TPU topology)."""
  m = re.fullmatch(r"(h100|h200):(?:(\d+)x)?(\d+)", topology.lower())
  if not m:
    return None
  return m.group(1), int(m.group(2) or 1), int(m.group(3))


def devices(topology: str) -> list:
  """The compile-only devices of a GPU topology; ImportError when the CUDA plugin is not installed."""
  import importlib
  importlib.import_module("jax_plugins.xla_cuda12")
  from jax.experimental import topologies
  name, hosts, per_host = parse(topology)
  topo = topologies.get_topology_desc(name, "cuda", target_config=target_config(name),
                                      topology=f"1x{hosts}x{per_host}")
  return list(topo.devices)
