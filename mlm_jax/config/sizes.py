"""Encoder sizes shared by configs/ and tools/benchmark.py (layers, hidden, heads, FFN)."""

SIZES = {
    "mini": dict(num_layers=4, hidden_size=256, num_heads=4, intermediate_size=1024),
    "small": dict(num_layers=4, hidden_size=512, num_heads=8, intermediate_size=2048),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072),
    "large": dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096),
}


def size(name: str) -> dict:
  if name not in SIZES:
    raise ValueError(f"unknown model size {name!r}: expected one of {sorted(SIZES)}")
  return dict(SIZES[name])
