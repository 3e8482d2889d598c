"""Model FLOPs per token and MFU, counted as MaxText and PaLM count them (6 per parameter per token).

The MLM head counts on the prediction slots only, the work this model does; `dense_flops_per_token`
counts it on every position, as Hugging Face's BERT does, for comparing with those peers.
"""
from __future__ import annotations

import time

import ml_collections


def layer_params(cfg: ml_collections.ConfigDict) -> int:
  """Matmul parameters of the Transformer layers (biases and norms are negligible and excluded)."""
  h, f = cfg.hidden_size, cfg.intermediate_size
  mlp = (3 if cfg.mlp == "geglu" else 2) * h * f
  return cfg.num_layers * (4 * h * h + mlp)


def attended_keys(cfg: ml_collections.ConfigDict, seq_len: int) -> int:
  """Keys a query attends to, summed over the layers: a local layer sees local_window + 1 of them.

  Counted for what the model needs, not what a kernel computes: the xla path scores all S keys of
  a local layer and masks them, so its MFU on long sequences is lower than its TFLOP/s suggest.
  """
  from mlm_jax.model import attention
  return sum(min(seq_len, attention.layer_window(cfg, i) + 1) if attention.layer_window(cfg, i) else seq_len
             for i in range(cfg.num_layers))


def flops_per_token(cfg: ml_collections.ConfigDict, seq_len: int, num_slots: int | None = None) -> float:
  """Training FLOPs per input token; the head (H*E + E*V matmuls, E = embedding size) counted on
  `num_slots` of `seq_len`, and ELECTRA's embedding projection (E*H) on every token when E != H."""
  from mlm_jax.model.encoder import embedding_size
  h, v, e = cfg.hidden_size, cfg.vocab_size, embedding_size(cfg)
  attention = 12 * h * attended_keys(cfg, seq_len)       # QK^T and PV, forward + backward
  head_fraction = 1.0 if num_slots is None else num_slots / seq_len
  head = 6 * (h * e + e * v) * head_fraction if cfg.mlm_head else 0.0
  project = 6 * e * h if e != h else 0
  return 6 * layer_params(cfg) + attention + head + project


def dense_flops_per_token(cfg: ml_collections.ConfigDict, seq_len: int) -> float:
  return flops_per_token(cfg, seq_len, None)


def measure_matmul_peak(n: int = 2048, repeats: int = 5, dtype: str = "float32",
                        min_seconds: float = 0.25) -> float:
  """Best achieved FLOP/s of one jitted square matmul on the default device (the MFU denominator): operands
  in `dtype`, accumulated and returned in float32 (how model.matmul='f32_out' runs a bfloat16 model's).

  Timed `repeats` times and for at least `min_seconds`: a CPU's first few calls after compiling run slow
  (threads waking, caches), and a 1024 bfloat16 matmul takes ~2 ms, so three calls read 0.46-1.0 TFLOP/s on
  one 2-core VM where a quarter second of calls reads 0.97-0.98."""
  import functools
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  f = jax.jit(functools.partial(jnp.dot, preferred_element_type=jnp.float32))
  f(a, b).block_until_ready()
  best, calls, start = float("inf"), 0, time.perf_counter()
  while calls < repeats or time.perf_counter() - start < min_seconds:
    t = time.perf_counter()
    f(a, b).block_until_ready()
    best, calls = min(best, time.perf_counter() - t), calls + 1
  return 2.0 * n ** 3 / best


def mfu(tokens_per_sec: float, flops_per_tok: float, peak_flops_per_sec: float) -> float:
  return tokens_per_sec * flops_per_tok / peak_flops_per_sec


GIB = 2**30
# Per chip: HBM bytes and peak dense bf16 FLOP/s (the vendors' documentation), by JAX's device_kind.
# The trainer takes MFU's denominator from here; the AOT tool also takes HBM (compile-only TPU
# devices report neither).
ACCELERATORS = {
    "TPU v4": (32 * GIB, 275e12),
    "TPU v5 lite": (16 * GIB, 197e12),
    "TPU v5": (95 * GIB, 459e12),
    "TPU v6 lite": (32 * GIB, 918e12),
    "NVIDIA A100": (80 * GIB, 312e12),
    "NVIDIA H100": (80 * GIB, 989e12),
    "NVIDIA H200": (141 * GIB, 989e12),
}


def accelerator_spec(device_kind: str) -> tuple[int, float] | None:
  """(HBM bytes, peak FLOP/s) per chip for a device kind ('NVIDIA H100 80GB HBM3' -> H100), or None."""
  if device_kind in ACCELERATORS:
    return ACCELERATORS[device_kind]
  known = [k for k in ACCELERATORS if device_kind.lower().startswith(k.lower())]
  return ACCELERATORS[max(known, key=len)] if known else None


def peak_flops(config: ml_collections.ConfigDict) -> float:
  """Peak FLOP/s of all devices (MFU's denominator in the training log): config override, a known
  accelerator's peak, or measured on CPU (a matmul in the model's compute dtype: a bfloat16 model's MFU
  is against the CPU's bfloat16 rate)."""
  import jax
  per = config.train.peak_tflops_per_device * 1e12
  if not per:
    spec = accelerator_spec(jax.devices()[0].device_kind)
    if not spec:   # a CPU: the measured peak is its process's, whose devices (config.cpu_devices) share its threads
      return measure_matmul_peak(n=1024, repeats=3, dtype=config.model.dtype) * jax.process_count()
    per = spec[1]
  return per * jax.device_count()
