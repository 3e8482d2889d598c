"""Whether the host CPU has bfloat16 dot instructions, which decide whether a bfloat16 model pays on CPU.

XLA:CPU's bfloat16 x bfloat16 -> float32 dots run at about twice the float32 rate on x86 with AVX512-BF16 or
AMX-BF16; without them (AVX2 only, e.g. AMD Zen 3) the same dots widen to float32 first and run slower than
float32 itself (docs/performance.md#a-cpu-without-bfloat16-instructions). Read from /proc/cpuinfo, so a
process can say so before it compiles anything; no jax import.
"""
import functools

# /proc/cpuinfo's names (x86 `flags`, Arm `Features`) and how the docs write them.
BF16_FLAGS = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"), ("bf16", "Arm BF16"))


def bf16_instructions(cpuinfo: str | None = None) -> str | None:
  """The CPU's bfloat16 dot instructions ('AMX-BF16 / AVX512-BF16'), '' where it has none, None where
  /proc/cpuinfo (or the `cpuinfo` text given) lists no flags to tell."""
  if cpuinfo is None:
    cpuinfo = _proc_cpuinfo()
  for line in cpuinfo.splitlines():
    key, sep, value = line.partition(":")
    if sep and key.strip() in ("flags", "Features"):
      have = set(value.split())
      return " / ".join(name for flag, name in BF16_FLAGS if flag in have)
  return None


@functools.cache
def _proc_cpuinfo() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      return f.read()
  except OSError:
    return ""
