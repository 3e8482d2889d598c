"""Prepare as an Apache Beam pipeline: prepare.py's units, run by any Beam runner, the same bytes.

  Create(units) -> Reshuffle -> ParDo: prepare one unit with prepare.run_unit (a unit whose done
  marker exists is read, not redone) -> ToList -> one step writes the manifest (prepare.write_manifest)

Retries, load balancing, autoscaling and progress are the runner's. Workers load the tokenizer from
the store's own copy (written before the pipeline starts), so they need no path of the launcher's.
apache_beam (the [beam] extra) is imported only in this module's functions. Commands:
docs/token_store.md#apache-beam-beyond-one-machine.
"""
import json
import logging
import os
from typing import Callable, Optional, Sequence

from mlm_jax import paths
from mlm_jax.data.store import prepare, shards
from mlm_jax.data.tokenizers import load as tokenizer_load
from mlm_jax.errors import ConfigError, DataError

RUNNERS = ("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner", "PortableRunner")
NAMESPACE = "mlm_jax.prepare"
# Beam's DirectRunner first tries the Prism runner (a binary it downloads) and ignores
# --direct_running_mode there; its batch engine, the FnApiRunner, runs the pipeline here with
# worker processes and no download.
_LOCAL_ENGINE = "FnApiRunner"


def _beam():
  try:
    import apache_beam as beam
  except ImportError:
    raise ConfigError("--runner needs Apache Beam: pip install -e '.[beam]' (in the repository)") from None
  return beam


def pipeline_options(runner: str, beam_args: Sequence[str], num_workers: Optional[int]):
  """PipelineOptions from Beam's own flags. DirectRunner: `num_workers` worker processes
  (--direct_running_mode=multi_processing, --direct_num_workers); other runners: Beam's --num_workers."""
  _beam()
  from apache_beam.options.pipeline_options import PipelineOptions
  if runner not in RUNNERS:
    raise ConfigError(f"--runner={runner!r}: expected one of {', '.join(RUNNERS)}")
  args = list(beam_args)
  given = lambda flag: any(a == flag or a.startswith(flag + "=") for a in args)  # noqa: E731
  if runner == "DirectRunner":
    args.append(f"--runner={_LOCAL_ENGINE}")
    if not given("--direct_running_mode"):
      args.append("--direct_running_mode=multi_processing")
    if num_workers and not given("--direct_num_workers"):
      args.append(f"--direct_num_workers={num_workers}")
  else:
    args.append(f"--runner={runner}")
    if num_workers and not given("--num_workers"):
      args.append(f"--num_workers={num_workers}")
  return PipelineOptions(args)


# ------------------------------------------------------------------------------------------
# The steps (module-level functions: a worker imports them by name)
# ------------------------------------------------------------------------------------------
_ENCODER = {}


def _encoder(root: str, main_file: str, sha: str, eval_percent: float) -> prepare.Encoder:
  """The worker's encoder, loaded once per process from the store's copy of the tokenizer."""
  key = (root, main_file, sha, eval_percent)
  if key not in _ENCODER:
    path = os.path.join(root, shards.TOKENIZER_DIR, main_file)
    tok = tokenizer_load.load(path)
    if tok.sha256 != sha:
      raise DataError(f"{path} (sha256 {tok.sha256[:16]}) is not the tokenizer this store was "
                      f"prepared with (sha256 {sha[:16]})")
    _ENCODER.clear()
    _ENCODER[key] = prepare.Encoder(tok, eval_percent)
  return _ENCODER[key]


def _counter(source: str, name: str):
  from apache_beam.metrics import Metrics
  return Metrics.counter(NAMESPACE, f"{source}/{name}")


def prepare_unit(element, opts: prepare.Options, root: str, main_file: str, sha: str):
  """(position, unit) -> (position, unit, done marker): the unit prepared, or read if done."""
  pos, unit = element
  marker = prepare.read_marker(root, unit)
  if marker is not None:
    _counter(unit.source, "units_skipped").inc()
    return pos, unit, marker
  docs, tokens = _counter(unit.source, "documents"), _counter(unit.source, "tokens")

  def progress(d, t):
    docs.inc(d)
    tokens.inc(t)

  try:
    marker = prepare.run_unit(root, unit, opts, _encoder(root, main_file, sha, opts.eval_percent),
                              progress)
  except DataError:
    raise
  except Exception as e:   # a bug or the machine (disk full): its traceback, with the unit named
    raise RuntimeError(prepare.in_unit(unit, f"{e.__class__.__name__}: {e}")) from e
  _counter(unit.source, "units_prepared").inc()
  for k, v in marker["stats"].items():
    if v:
      _counter(unit.source, k).inc(v)
  return pos, unit, marker


def write_manifest(summaries: list, opts: prepare.Options, root: str, main_file: str, sha: str,
                   n_units: int) -> None:
  by_pos = {pos: (unit, marker) for pos, unit, marker in summaries}
  if sorted(by_pos) != list(range(n_units)):
    raise RuntimeError(f"the manifest step got {len(by_pos)} of {n_units} units")
  units, markers = zip(*(by_pos[i] for i in range(n_units)))
  tok = tokenizer_load.load(os.path.join(root, shards.TOKENIZER_DIR, main_file))
  prepare.write_manifest(root, opts, tok, sha, list(units), list(markers))


# ------------------------------------------------------------------------------------------
# Building and running the pipeline
# ------------------------------------------------------------------------------------------
def build(p, opts: prepare.Options, root: str, units: list, main_file: str, sha: str) -> None:
  """Adds the steps to Beam pipeline `p`."""
  beam = _beam()
  summaries = (p
               | "Units" >> beam.Create(list(enumerate(units)), reshuffle=False)
               | "Reshuffle" >> beam.Reshuffle()
               | "Prepare unit" >> beam.Map(prepare_unit, opts, root, main_file, sha))
  _ = (summaries
       | "Gather summaries" >> beam.combiners.ToList()
       | "Write manifest" >> beam.Map(write_manifest, opts, root, main_file, sha, len(units)))


def run(opts: prepare.Options, root: str, runner: str, beam_args: Sequence[str] = (),
        num_workers: Optional[int] = None, log: Optional[Callable[[str], None]] = None):
  """Pins the options and the tokenizer into `root`, runs the pipeline to its end; returns
  (manifest, {source: {counter: value}}) with the counters of this run's work."""
  beam = _beam()
  log = log or logging.warning
  options = pipeline_options(runner, beam_args, num_workers)
  tok = tokenizer_load.load(opts.tokenizer)
  sha = prepare.pin_options(root, opts, tok)
  units = prepare.plan(opts)
  log(f"[prepare] {len(units)} units on Beam's {runner}")
  p = beam.Pipeline(options=options)
  build(p, opts, root, units, tok.main_file, sha)
  result = p.run()
  result.wait_until_finish()
  manifest = json.loads(paths.read_bytes(os.path.join(root, shards.MANIFEST)))
  try:
    found = counters(result)
  except Exception as e:  # noqa: BLE001 - a runner without metrics: the store is done all the same
    log(f"[prepare] the runner's counters could not be read: {e.__class__.__name__}: {e}")
    found = {}
  return manifest, found


def counters(result) -> dict:
  """{source: {name: value}} of the pipeline's counters (committed where the runner has them)."""
  from apache_beam.metrics.metric import MetricsFilter
  out = {}
  for c in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]:
    source, _, name = c.key.metric.name.rpartition("/")
    value = c.committed if c.committed is not None else c.attempted
    out.setdefault(source, {})[name] = out.get(source, {}).get(name, 0) + value
  return out


def failure_line(error: BaseException) -> str:
  """The one line that names a failed unit in a runner's error (which carries the worker's traceback
  as text), or the error's last line."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  for line in reversed(lines):
    _, found, rest = line.partition("cannot prepare source ")
    if found:
      return (found + rest).split(" [while running")[0]
  return lines[-1] if lines else error.__class__.__name__
