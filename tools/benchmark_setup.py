"""What the train-step benchmarks (`benchmark.py train` and `benchmark.py compare`) set up alike: the
config of --model or --config, resolved as the binaries resolve it, and random rows to step on."""
import os
import sys

from mlm_jax.config.sizes import SIZES


def with_config(args, overrides: dict | None = None):
  """`args` with --config's ConfigDict (`overrides`, {"section.field": value}, set on it) as `file_config`,
  and the sizes it supplies where no flag gave them."""
  args.file_config = _load_config(args.config) if args.config else None
  for key, value in (overrides or {}).items():
    section, field = key.split(".", 1)
    args.file_config[section][field] = value
  for k, default in _SIZE_DEFAULTS.items():   # None: not given; the config's value, else the default
    if getattr(args, k) is None:
      setattr(args, k, default if args.file_config is None else _CONFIG_VALUES[k](args.file_config))
  return args


# Flags a --config file supplies when they are not given, and where in the config they are.
_SIZE_DEFAULTS = dict(seq_len=128, batch=32, vocab=32000, dtype="float32", dropout=0.1, devices=1)
_CONFIG_VALUES = dict(seq_len=lambda c: c.data.seq_len, batch=lambda c: c.train.batch_size,
                      vocab=lambda c: c.model.vocab_size if c.model.vocab_size > 0 else c.tokenizer.vocab_size,
                      dtype=lambda c: c.model.dtype, dropout=lambda c: c.model.hidden_dropout,
                      devices=lambda c: c.get("cpu_devices", 0) or 1)


def _load_config(spec: str):
  """configs/NAME.py[:variant] -> its ConfigDict, as --config of the binaries reads it."""
  import importlib.util
  path, _, variant = spec.partition(":")
  if not os.path.isfile(path):
    sys.exit(f"--config={spec}: no such config file {path}")
  module_spec = importlib.util.spec_from_file_location("_benchmark_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(variant) if variant else module.get_config()


def resolved_run(args, platform: str):
  """(the resolved run: checked and frozen config, objective; why its attention implementation), as the
  binaries resolve."""
  from mlm_jax.training import resolve
  from mlm_jax.config.defaults import default_config
  if args.file_config is not None:   # the file's model, objective, masking and optimizer, with the flags' sizes
    c = args.file_config
    c.model.update(dict(vocab_size=args.vocab, dtype=args.dtype, hidden_dropout=args.dropout,
                        attention_dropout=args.dropout))
    c.train.update(dict(probe_every=0, eval_every=0))
    if args.max_predictions:
      c.masking.max_predictions = args.max_predictions
  else:
    c = default_config()
    c.model.update(SIZES[args.model])
    c.model.update(dict(vocab_size=args.vocab, dtype=args.dtype, hidden_dropout=args.dropout,
                        attention_dropout=args.dropout, max_position_embeddings=max(512, args.seq_len),
                        attention_impl=args.attention_impl, scan_layers=args.scan_layers, remat=args.remat))
    c.masking.update(dict(mode=args.mask_mode, max_predictions=args.max_predictions))
  c.masking.update(dict(mask_id=args.vocab - 1, special_ids=(0, 1, 2, 3)))
  if args.matmul is not None:
    c.model.matmul = args.matmul
  c.train.update(dict(steps=args.steps + args.warmup + 1, batch_size=args.batch))
  c.mesh.update(dict(data=args.devices, fsdp=1, tensor=1))
  # One segment per row, no padding (the batches below), as concat packing makes them: what cudnn serves.
  c.data.update(dict(seq_len=args.seq_len, packing="concat"))
  run = resolve.resolve_for_compile(c, platform)
  return run, next(n for n in run.notes if n.startswith("attention: "))[len("attention: "):]


def random_batches(args, n: int = 4) -> list:
  """Random token rows, one document each (BOS ... EOS), no padding."""
  import numpy as np
  rng = np.random.default_rng(0)
  b, s = args.batch, args.seq_len
  batches = []
  for _ in range(n):
    ids = rng.integers(4, args.vocab - 1, (b, s)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 0, 2
    batches.append(dict(input_ids=ids, segment_ids=np.ones((b, s), np.int32),
                        positions=np.broadcast_to(np.arange(s, dtype=np.int32), (b, s)).copy(),
                        word_starts=np.ones((b, s), np.int32)))
  return batches
