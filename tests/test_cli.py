"""The runtime tuning the binaries share (mlm_jax/cli.py)."""
import jax

from mlm_jax import cli


def test_keep_freed_memory_applies_on_cpu_and_can_be_turned_off(monkeypatch):
  assert jax.default_backend() == "cpu"
  monkeypatch.setenv("MLM_JAX_KEEP_FREED_MEMORY", "0")
  assert cli.keep_freed_memory() is False
  monkeypatch.delenv("MLM_JAX_KEEP_FREED_MEMORY")
  assert cli.keep_freed_memory() is True     # glibc accepted both mallopt settings
