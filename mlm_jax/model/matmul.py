"""The model's matmuls: as XLA writes them in the compute dtype, or with bfloat16 operands and float32 results.

`model.matmul='f32_out'` (what `auto` picks on CPU for a bfloat16 / float16 model): every matmul of the
forward and the backward pass takes its operands in the compute dtype and returns float32, rounded to the
compute dtype by the op that consumes it. XLA:CPU runs a bfloat16 x bfloat16 -> float32 dot through
YNNPACK at the processor's bfloat16 rate (AVX512-BF16), but one with a bfloat16 result, the form that
`jnp.einsum` on bfloat16 operands and its autodiff give, on a slower path (docs/performance.md). Weight
gradients come back in the weight's dtype (float32 master weights get unrounded float32 gradients).
`xla` (the default elsewhere, and for float32 models) is `jnp.einsum` in the compute dtype.

What XLA:CPU (jaxlib 0.10.2) needs for that, found in its optimized HLO: YNNPACK takes a dot only when
its first operand has the contracted indices last (a weight gradient, which sums over the tokens, has
them first), in XLA's default layout (a transpose's is not), and with an output that lists the first
operand's free indices before the second's; otherwise XLA upcasts a 2-d dot to float32 (Eigen) and a
batched one fails at run time ("Unsupported element type for DotThunk"). `_matmul` writes each dot so.
Under sharding the step stays correct (tests/test_matmul.py runs it on 8 CPU devices); the transposed
copies are cut along a dimension that is not the batch's, so they need no communication.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import ml_collections

from mlm_jax.config import choices
from mlm_jax.runtime import cpu_features

MODES = choices.CHOICES["model.matmul"]
# config.json files written before the field lack it and mean this value (workdir/migrate.py).
NEW_FIELDS = dict(matmul="auto")


def resolve(cfg: ml_collections.ConfigDict, platform: str) -> str:
  """`model.matmul` for `platform` ('cpu', 'gpu', 'tpu': the mesh's; training/resolve.py writes it into the
  run's resolved config): `auto` is f32_out on CPU for a model computing in less than float32, else xla."""
  return _resolve(cfg.matmul, cfg.dtype, platform)


def cpu_dtype_warning(cfg: ml_collections.ConfigDict, platform: str, cpuinfo: str | None = None) -> str:
  """One line for a bfloat16 model on a CPU without bfloat16 dot instructions, where float32 is faster (bfloat16
  ran at 0.59-0.98x float32's tokens/s from the recipe to base on an AVX2-only Zen 3 VM); '' elsewhere, or where
  the CPU cannot say (`cpuinfo`: /proc/cpuinfo's text, the host's by default). A warning, not an error: the
  run is correct in bfloat16, only slower."""
  if platform != "cpu" or jnp.dtype(cfg.dtype) != jnp.bfloat16 or cpu_features.bf16_instructions(cpuinfo) != "":
    return ""
  return ("model.dtype=bfloat16 on a CPU without AVX512-BF16, AMX-BF16 or Arm BF16: its bfloat16 matmuls "
          "run slower than float32 here (docs/performance.md#a-cpu-without-bfloat16-instructions); "
          "--config.model.dtype=float32 is the faster choice on this CPU")


def _resolve(mode: str, dtype, platform: str) -> str:
  choices.check("model.matmul", mode)
  if mode != "auto":
    return mode
  return "f32_out" if platform == "cpu" and jnp.dtype(dtype) != jnp.float32 else "xla"


def _gradient_specs(spec: str) -> tuple[str, str]:
  """The einsums of the two input gradients of `spec` ('lhs,rhs->out'): 'out,rhs->lhs' and 'lhs,out->rhs'."""
  inputs, out = spec.replace(" ", "").split("->")
  lhs, rhs = inputs.split(",")
  for name, operand, other in (("lhs", lhs, rhs), ("rhs", rhs, lhs)):
    if any(c not in out and c not in other for c in operand):
      raise ValueError(f"einsum {spec!r}: an index of the {name} is summed within it (not a matmul)")
  return f"{out},{rhs}->{lhs}", f"{lhs},{out}->{rhs}"


def _plan(sa: str, sb: str, out: str) -> tuple[str, str]:
  """How XLA:CPU's YNNPACK dot takes 'sa,sb->out' with `sa` first: (the first operand's index order, the
  dot's output order); where either differs from `sa` or `out`, that array is transposed. YNNPACK takes
  a first operand only with the indices it contracts last (XLA upcasts a 2-d dot with another one to
  float32, and a batched one fails to run), and XLA reorders a dot whose output lists a free index of
  the second operand before one of the first, so such an output is made in order and transposed."""
  contracted = [c for c in sa if c not in out]
  order = sa
  if sa[len(sa) - len(contracted):] != "".join(contracted):
    order = "".join(c for c in sa if c in out) + "".join(contracted)
  free_a, free_b = [c for c in sa if c in out and c not in sb], [c for c in sb if c in out and c not in sa]
  positions = {c: i for i, c in enumerate(out)}
  reversed_out = any(positions[b] < positions[a] for a in free_a for b in free_b)
  dot_out = out
  if reversed_out:
    batch = [c for c in out if c in sa and c in sb]
    dot_out = "".join(batch + [c for c in order if c in free_a] + [c for c in sb if c in free_b])
  return order, dot_out


def _materialized(x, spec: str, to: str):
  """x (indices `spec`) transposed to `to` as an array of its own. A plain transpose would be folded
  into the dot (as a transposed operand, or by swapping the operands); the concatenation of its two
  halves holds the same values in XLA's default layout, which the dot reads as it is. The halves are
  cut along an axis other than `spec`'s first, which is the one a batch-sharded array is split on."""
  if spec == to:
    return x
  t = jnp.transpose(x, [spec.index(c) for c in to])
  axis = next((i for i, c in enumerate(to) if c != spec[0] and t.shape[i] >= 2), None)
  if axis is None:
    return t
  half = t.shape[axis] // 2
  return jnp.concatenate([jax.lax.slice_in_dim(t, 0, half, axis=axis), jax.lax.slice_in_dim(t, half, None, axis=axis)],
                         axis=axis)


def _matmul(spec: str, a, b):
  """einsum(spec, a, b) in float32 on operands of one dtype, in the form XLA:CPU's YNNPACK dot takes
  (`_plan`): of the two operand orders, the one whose transposed copies hold the fewer elements (for a
  batched dot, the fewer copies). A transpose is memory-bound work outside the dot: the weight gradient
  of the FFN's output projection transposes the [tokens, 192] gradient and the [192, 768] result rather
  than the [tokens, 768] input, the MLM loss's slot gradient the embeddings rather than the [vocabulary,
  slots] logits gradient (the recipe's bfloat16 step on the Intel VM: 1.09-1.21x tokens/s idle, median
  1.17; docs/performance.md)."""
  inputs, out = spec.split("->")
  sa, sb = inputs.split(",")
  size = dict(zip(sa, a.shape)) | dict(zip(sb, b.shape))
  out_elements = math.prod(size[c] for c in out)
  batched = any(c in sb and c in out for c in sa)

  def moved(plan):
    s1, _, x, _, order, dot_out = plan
    if batched:   # attention's: counted; weighed too, the step gained less (1.02-1.15x, loaded)
      return int(order != s1) + int(dot_out != out)
    return (x.size if order != s1 else 0) + (out_elements if dot_out != out else 0)

  plans = [(s1, s2, x, y, *_plan(s1, s2, out)) for s1, s2, x, y in ((sa, sb, a, b), (sb, sa, b, a))]
  s1, s2, x, y, order, dot_out = min(plans, key=moved)
  z = jnp.einsum(f"{order},{s2}->{dot_out}", _materialized(x, s1, order), y, preferred_element_type=jnp.float32)
  if dot_out != out:   # else XLA folds the transpose back into the dot, swapping its operands
    z = jax.lax.optimization_barrier(z)
  return _materialized(z, dot_out, out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def f32_out_einsum(spec: str, a, b, dtype):
  """einsum(spec, a, b) on operands cast to `dtype`, accumulated and returned in float32; its gradients
  likewise (the cotangent cast to `dtype`), each in its input's dtype."""
  return _matmul(spec.replace(" ", ""), a.astype(dtype), b.astype(dtype))


def _fwd(spec, a, b, dtype):
  return f32_out_einsum(spec, a, b, dtype), (a, b)


def _bwd(spec, dtype, residuals, g):
  a, b = residuals
  spec_a, spec_b = _gradient_specs(spec)
  g = g.astype(dtype)
  da = _matmul(spec_a, g, b.astype(dtype))
  db = _matmul(spec_b, a.astype(dtype), g)
  return da.astype(a.dtype), db.astype(b.dtype)


f32_out_einsum.defvjp(_fwd, _bwd)


def effective(mode: str, dtype) -> str:
  """What `mode` (model.matmul) does for compute dtype `dtype`: 'f32_out' or 'xla' (an `auto` left
  unresolved, as in a model built outside a run, is resolved for the default backend)."""
  if mode == "auto":
    mode = _resolve(mode, dtype, jax.default_backend())
  return "f32_out" if mode == "f32_out" and jnp.dtype(dtype) != jnp.float32 else "xla"


def einsum(spec: str, a, b, dtype, mode: str, bias=None):
  """einsum(spec, a, b) (+ bias) in the compute dtype `dtype`, its result in `dtype`; `mode` = model.matmul.
  Under f32_out the bias is added to the float32 result before rounding, so its gradient is a float32 sum
  (XLA:CPU sums a long bfloat16 reduction in a slow pairwise reduce-window)."""
  if effective(mode, dtype) == "f32_out":
    out = f32_out_einsum(spec, a, b, jnp.dtype(dtype))
    return (out if bias is None else out + bias.astype(jnp.float32)).astype(dtype)
  out = jnp.einsum(spec, a.astype(dtype), b.astype(dtype))
  return out if bias is None else out + bias.astype(dtype)


def dot_f32(spec: str, a, b, mode: str):
  """einsum(spec, a, b) on operands of one dtype with a float32 result (XLA's preferred_element_type), for
  code that writes its own gradients (objectives/sparse_loss.py); under f32_out, in YNNPACK's form."""
  if effective(mode, a.dtype) == "f32_out":
    return _matmul(spec.replace(" ", ""), a, b)
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def einsum_f32(spec: str, a, b, dtype, mode: str):
  """The same with a float32 result (attention logits)."""
  if effective(mode, dtype) == "f32_out":
    return f32_out_einsum(spec, a, b, jnp.dtype(dtype))
  return jnp.einsum(spec, a.astype(dtype), b.astype(dtype)).astype(jnp.float32)
