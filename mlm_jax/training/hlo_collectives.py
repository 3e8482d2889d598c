"""The collectives of a compiled TPU program, and which of them cross slices over the data-center network.

Read from the optimized HLO text (`compiled.as_text()`). XLA compiles a multi-slice job as one SPMD
program per slice (`num_partitions` = the devices of a slice): collectives inside a slice stay
all-reduce, all-gather, reduce-scatter, all-to-all and collective-permute instructions (ICI; async
`-start` forms counted once, `-done` not at all), and every collective between slices becomes a host
transfer to the Megascale runtime: a `send` whose `_xla_megascale_transfer_type` names the
collective (ALL_REDUCE, ALL_GATHER, ...) and whose operand is what this device contributes.

`dcn_bytes` is what one device sends over the DCN per step for those, with ring algorithms over
the n slices: all-reduce 2(n-1)/n of its buffer, reduce-scatter and all-to-all (n-1)/n, all-gather
n-1 times its shard. Static ops: a collective in a loop body (scanned layers, gradient
accumulation) is counted once.
"""
from __future__ import annotations

import math
import re

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_ICI = re.compile(r"=\s*(?P<shape>.+?)\s+(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                  r"(?:-start)?\(")
_SEND = re.compile(r"=\s*(?P<shape>.+?)\s+send\(")
_DCN_KIND = re.compile(r'_xla_megascale_transfer_type="([A-Z_]+)"')
_ARRAY = re.compile(r"\b(pred|s4|u4|s8|u8|s16|u16|s32|u32|s64|u64|f8e4m3fn|f8e5m2|bf16|f16|f32|f64|c64|c128)"
                    r"\[([0-9,]*)\]")
_BITS = dict(pred=8, s4=4, u4=4, s8=8, u8=8, s16=16, u16=16, s32=32, u32=32, s64=64, u64=64, f8e4m3fn=8, f8e5m2=8,
             bf16=16, f16=16, f32=32, f64=64, c64=64, c128=128)


def array_bytes(shape_text: str, which: str = "max") -> int:
  """Bytes of the largest (or the first) array in an HLO shape such as `(f32[8,128]{1,0}, u32[], token[])`."""
  sizes = [math.prod(int(x) for x in dims.split(",") if x) * _BITS[t] // 8 for t, dims in _ARRAY.findall(shape_text)]
  if not sizes:
    return 0
  return sizes[0] if which == "first" else max(sizes)


def _ring_factor(kind: str, n: int) -> float:
  if kind == "all-reduce":
    return 2.0 * (n - 1) / n
  if kind == "all-gather":
    return float(n - 1)
  if kind == "collective-permute":
    return 1.0
  return (n - 1) / n


def _entry(table: dict, kind: str) -> dict:
  return table.setdefault(kind, dict(count=0, bytes=0, cross_slice=0, dcn_payload_bytes=0, dcn_bytes=0.0))


def summary(hlo_text: str, num_slices: int = 1) -> dict:
  """{by_kind: {kind: {count, bytes, cross_slice, dcn_payload_bytes, dcn_bytes}}, cross_slice, dcn_bytes}.

  `count`/`bytes`: collectives inside a slice (ICI) and their result payload per device;
  `cross_slice`/`dcn_payload_bytes`/`dcn_bytes`: those between slices, what each device hands over,
  and what it sends over the DCN by the ring estimate above.
  """
  by_kind: dict = {}
  for line in hlo_text.splitlines():
    m = _ICI.search(line)
    if m and "-done(" not in line:
      e = _entry(by_kind, m.group("op"))
      e["count"] += 1
      e["bytes"] += array_bytes(m.group("shape"))
      continue
    kind = _DCN_KIND.search(line)
    m = _SEND.search(line) if kind else None
    if m:
      name = kind.group(1).lower().replace("_", "-")
      payload = array_bytes(m.group("shape"), "first")
      e = _entry(by_kind, name)
      e["cross_slice"] += 1
      e["dcn_payload_bytes"] += payload
      e["dcn_bytes"] += payload * _ring_factor(name, max(num_slices, 2))
  return dict(by_kind=by_kind, cross_slice=sum(k["cross_slice"] for k in by_kind.values()),
              dcn_bytes=sum(k["dcn_bytes"] for k in by_kind.values()))
