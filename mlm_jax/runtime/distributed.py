"""One run of several processes: joining JAX's multi-controller runtime, barriers, and telling that
another process of the run is gone (docs/multihost.md)."""
from __future__ import annotations

import os
import sys
from typing import Callable

from mlm_jax.runtime import peer_watch


def initialize_distributed(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1,
                           heartbeat_timeout_s: int = 60) -> None:
  """Joins JAX's multi-controller runtime when this is one process of several; else does nothing.

  Explicit arguments (or MLM_JAX_COORDINATOR / MLM_JAX_NUM_PROCESSES / MLM_JAX_PROCESS_ID) win;
  otherwise TPU VM slices and SLURM jobs are detected by JAX itself (multi-slice TPU jobs by the
  MEGASCALE_* variables the TPU runtime sets, or MLM_JAX_DISTRIBUTED=1, which launch/tpu_vm.sh
  --num_slices sets for slices of one host each). On CPU the processes talk
  through gloo, so several processes on one machine form one job (tests, launch/local_multiprocess.sh).
  A process that ends without a farewell ends the others at once (peer_watch.py); one that stops
  heart-beating (a hung host) makes the others fail after `heartbeat_timeout_s` instead of waiting
  forever in a collective.
  """
  import jax
  from absl import logging
  from mlm_jax.errors import ConfigError
  coordinator_address = coordinator_address or os.environ.get("MLM_JAX_COORDINATOR", "")
  num_processes = num_processes or int(os.environ.get("MLM_JAX_NUM_PROCESSES", "0"))
  if process_id < 0:
    process_id = int(os.environ.get("MLM_JAX_PROCESS_ID", "-1"))
  kw = dict(heartbeat_timeout_seconds=heartbeat_timeout_s, initialization_timeout=max(heartbeat_timeout_s, 120))
  if coordinator_address:
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ConfigError(f"coordinator {coordinator_address!r} given, but num_processes={num_processes} and "
                        f"process_id={process_id}: expected 0 <= process_id < num_processes")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id, **kw)
  elif os.environ.get("SLURM_JOB_ID") and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
    jax.distributed.initialize(**kw)
  elif (os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") >= 1 or os.environ.get("MEGASCALE_COORDINATOR_ADDRESS")
        or os.environ.get("MLM_JAX_DISTRIBUTED") == "1"):   # several hosts of a slice, or several slices
    jax.distributed.initialize(**kw)
  else:
    return
  peer_watch.start(heartbeat_timeout_s)
  logging.info("process %d of %d, %d local / %d global devices", jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


def sync_processes(name: str) -> None:
  """Barrier across processes (a no-op with one process)."""
  import jax
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def first_process_then_all(name: str, work: Callable[[], None]) -> None:
  """`work()` on process 0 only (a file every process then reads), then a barrier named `name`."""
  import jax
  if jax.process_index() == 0:
    work()
  sync_processes(name)


# What a collective or the coordination service says when another process of the run is gone (gloo on
# CPU, NCCL on GPUs, the coordination service's heartbeats and barriers).
_PEER_GONE = ("Gloo", "gloo", "NCCL", "Connection reset by peer", "Connection closed by peer", "heartbeat",
              "coordination service", "Barrier timed out", "Socket closed", "tasks are unhealthy")


def peer_lost(e: BaseException) -> bool:
  """Whether `e`, raised in a process of several, means another process of the run has stopped."""
  if "jax" not in sys.modules or isinstance(e, (KeyboardInterrupt, SystemExit)):
    return False
  import jax
  from mlm_jax.errors import PeerLost, UserError
  if isinstance(e, PeerLost):
    return True
  if isinstance(e, UserError) or jax.process_count() == 1:
    return False
  return any(m in str(e) for m in _PEER_GONE)
