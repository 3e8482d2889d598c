"""model.matmul='f32_out' (mlm_jax/model/matmul.py): bfloat16 operands, float32 results, forward and backward.

Values and gradients against a float32 einsum of the same bfloat16 numbers; the compiled bfloat16 train
step on CPU has only bfloat16 x bfloat16 -> float32 dots (the form XLA:CPU runs at the bfloat16 rate) and
the same loss on 1 and 8 devices.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlm_jax.errors import ConfigError
from mlm_jax.model import matmul, sharding
from mlm_jax.objectives import sparse_loss
from mlm_jax.objectives.mlm import MLM
from mlm_jax.runtime import cpu_features
from mlm_jax.training import resolve, trainer as trainer_lib

from test_step import batch, tiny_config  # noqa: F401 - the module's real-text batch fixture

# Every einsum the encoder and the MLM loss write, with small shapes (b=2, s=q=k=6, n=2 heads, d=4, h=8).
SPECS = [
    ("bsh,hnd->bsnd", (2, 6, 8), (8, 2, 4)),       # q, k, v projections
    ("bqnd,bknd->bnqk", (2, 6, 2, 4), (2, 6, 2, 4)),   # attention logits
    ("bnqk,bknd->bqnd", (2, 2, 6, 6), (2, 6, 2, 4)),   # probabilities x values
    ("bsnd,ndh->bsh", (2, 6, 2, 4), (2, 4, 8)),       # output projection
    ("bsi,io->bso", (2, 6, 8), (8, 16)),              # MLP
    ("vh,nh->vn", (40, 8), (12, 8)),                  # vocabulary logits of the prediction slots
]


def _bf16_values(key, shape):
  """float32 numbers that bfloat16 holds exactly, so both sides multiply the same values."""
  return jax.random.normal(key, shape, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32)


@pytest.mark.parametrize("spec,sa,sb", SPECS, ids=[s[0] for s in SPECS])
def test_values_and_gradients_match_a_float32_einsum(spec, sa, sb):
  ka, kb, kg = jax.random.split(jax.random.key(0), 3)
  a, b = _bf16_values(ka, sa), _bf16_values(kb, sb)

  @jax.jit
  def both(a, b, g):
    out, vjp = jax.vjp(lambda a, b: matmul.f32_out_einsum(spec, a, b, jnp.bfloat16), a, b)
    want, vjp_ref = jax.vjp(lambda a, b: jnp.einsum(spec, a, b, precision="highest"), a, b)
    _, vjp16 = jax.vjp(lambda a, b: matmul.f32_out_einsum(spec, a, b, jnp.bfloat16),
                       a.astype(jnp.bfloat16), b.astype(jnp.bfloat16))
    return out, want, vjp(g), vjp_ref(g), vjp16(g)

  g = _bf16_values(kg, jax.eval_shape(lambda a, b: jnp.einsum(spec, a, b), a, b).shape)
  out, want, (da, db), (da_ref, db_ref), (da16, db16) = both(a, b, g)   # g: rounded to bfloat16 as the step does
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  assert da.dtype == db.dtype == jnp.float32   # float32 inputs (master weights) get float32 gradients
  np.testing.assert_allclose(da, da_ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(db, db_ref, rtol=1e-5, atol=1e-5)
  assert da16.dtype == db16.dtype == jnp.bfloat16   # bfloat16 inputs get the float32 gradients rounded
  np.testing.assert_array_equal(da16, da_ref.astype(jnp.bfloat16))
  np.testing.assert_array_equal(db16, db_ref.astype(jnp.bfloat16))


def test_the_mlm_loss_in_f32_out_matches_float32():
  """The sparse loss writes its own backward pass: under f32_out its matmuls take the same form."""
  ky, ke, kl = jax.random.split(jax.random.key(1), 3)
  y, emb = _bf16_values(ky, (12, 8)), _bf16_values(ke, (40, 8))
  bias, labels, weights = jnp.zeros(40), jax.random.randint(kl, (12,), 0, 40), jnp.ones(12)
  loss = lambda mode, y: sparse_loss.sparse_cross_entropy(y, emb, bias, labels, weights, mode)[0]
  got, g_got = jax.value_and_grad(lambda y: loss("f32_out", y.astype(jnp.bfloat16)))(y)
  want, g_want = jax.value_and_grad(lambda y: loss("xla", y))(y)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # dz and the result are rounded to bfloat16: within its precision of the largest gradient
  np.testing.assert_allclose(g_got, g_want, rtol=1e-2, atol=1e-2 * float(jnp.abs(g_want).max()))


def test_auto_is_f32_out_on_cpu_below_float32_only():
  c = tiny_config()
  assert matmul.resolve(c.model, "cpu") == "xla"   # float32: jnp.einsum as it was
  c.model.dtype = "bfloat16"
  assert [matmul.resolve(c.model, p) for p in ("cpu", "gpu", "tpu")] == ["f32_out", "xla", "xla"]
  c.model.matmul = "xla"
  assert matmul.resolve(c.model, "cpu") == "xla"
  c.model.matmul = "fast"
  with pytest.raises(ConfigError, match="model.matmul='fast'"):
    matmul.resolve(c.model, "cpu")
  c.model.matmul = "auto"
  # the run's config says what its step does (the AOT tool compiles for TPU on a CPU host)
  assert resolve.resolve_for_compile(c, "cpu").config.model.matmul == "f32_out"
  assert resolve.resolve_for_compile(c, "tpu").config.model.matmul == "xla"


ZEN3 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c\n"   # /proc/cpuinfo's form
ZEN4 = "flags\t\t: avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
NEOVERSE_V1 = "Features\t: fp asimd sve bf16 i8mm\n"


def test_bf16_instructions_and_the_warning_for_a_cpu_without_them():
  assert [cpu_features.bf16_instructions(t) for t in (ZEN3, ZEN4, SAPPHIRE_RAPIDS, NEOVERSE_V1, "")] == [
      "", "AVX512-BF16", "AMX-BF16 / AVX512-BF16", "Arm BF16", None]
  c = tiny_config()
  assert matmul.cpu_dtype_warning(c.model, "cpu", ZEN3) == ""   # float32
  c.model.dtype = "bfloat16"
  warning = matmul.cpu_dtype_warning(c.model, "cpu", ZEN3)
  assert warning.startswith("model.dtype=bfloat16 on a CPU without AVX512-BF16") and "float32" in warning
  assert "\n" not in warning
  # a CPU that has them, one that cannot say, and an accelerator: nothing to say
  assert [matmul.cpu_dtype_warning(c.model, p, t) for p, t in (("cpu", ZEN4), ("cpu", SAPPHIRE_RAPIDS),
                                                                 ("cpu", NEOVERSE_V1), ("cpu", ""),
                                                                 ("gpu", ZEN3))] == [""] * 5


def _step(c, devices, batch):
  """(the compiled step's HLO, the loss of one step) of `c` on `devices` devices."""
  tr = trainer_lib.make_trainer(c, sharding.make_mesh(c.mesh, jax.devices()[:devices]), MLM)
  state = tr.init()
  args = (state, jax.device_put(batch, tr.batch_sharding), jax.random.key(0), tr.values)
  compiled = tr.train_step.lower(*args).compile()
  _, metrics = compiled(*args)
  return compiled.as_text(), float(metrics["loss_sum"] / metrics["num_predictions"])


def _dot_operand_types(hlo: str) -> set:
  types = dict(re.findall(r"%(\S+) = (\w+)\[", hlo))
  return {(types[a], types[b], out) for out, a, b in re.findall(r"= (\w+)\[[^=]*? dot\(%([^,]+), %([^)]+)\)", hlo)}


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's dots")
def test_bf16_step_runs_only_bf16_dots_on_one_and_eight_devices(batch):  # noqa: F811 - the fixture
  c = tiny_config(num_layers=1, hidden_dropout=0.0, attention_dropout=0.0, dtype="bfloat16")   # auto: f32_out on CPU
  c.mesh.update(dict(data=1, fsdp=1, tensor=1))
  hlo, loss = _step(c, 1, batch)
  assert _dot_operand_types(hlo) == {("bf16", "bf16", "f32")}, _dot_operand_types(hlo)
  assert 0 < loss < 2 * np.log(c.model.vocab_size)
  c.mesh.update(dict(data=2, fsdp=2, tensor=2))
  _, loss8 = _step(c, 8, batch)
  np.testing.assert_allclose(loss8, loss, rtol=1e-3)
