"""Preemption: SIGTERM on any host stops every host of the run at one agreed step, saved by all.

One process: SIGTERM sets a flag that the loop reads after each step (`stop_at`); a SIGTERM that comes
during evaluation or a probe is seen before the save of that step (`requested`).

Several processes (jax.distributed): each host seeing SIGTERM at its own step would leave one host in
the save's barrier while another dispatches the next step's collectives. JAX's preemption service
decides instead: its C++ handler takes SIGTERM on whichever hosts get it, tells the coordination
service, and every host reports the last step it reached; the agreed step is the largest + 1, which no
host has passed. `multihost_utils.reached_preemption_sync_point(step)`, called after every step on
every host, is true there and nowhere else. No Python handler is installed then (it would replace
the service's). Step ids must rise on every host from the same first id: the loop registers its
start step before compiling, and a notice that reached the service before every host had registered
(during start-up or restore) is agreed on once with a collective: every host then stops at its start.

A watchdog ends a process whose main thread does not reach the save `timeout_s` after the signal
(blocked in tf.data on a stalled file system, say), without saving: exit code 1, the last checkpoint
intact. With one process it wakes on the signal itself (a wakeup fd); with several it polls the
coordination service's record of the notice every second.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Callable

import jax
import numpy as np
from absl import logging

# Where JAX's preemption service records a notice in the coordination service's key-value store (XLA's
# preemption_sync_manager.cc); read only to tell the watchdog and the start-up check that one came.
_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"


def _service():
  """The distributed runtime's client, when this process is one of several with the preemption service."""
  from jax._src import distributed
  state = distributed.global_state
  if jax.process_count() > 1 and state.client is not None and state.preemption_sync_manager is not None:
    return state.client
  return None


class Preemption:
  """Decides, after each step, whether the run stops there to save (see the module docstring)."""

  def __init__(self, timeout_s: float, start: int, on_stuck: Callable[[], None]):
    """`on_stuck`: what the watchdog runs before exiting (wait for a save already being written)."""
    self.timeout_s, self.on_stuck = float(timeout_s), on_stuck
    self.phase = "start"            # what the main thread is doing: start, input, step, save
    self.preempted = False
    self._done = threading.Event()
    self._client = _service()
    self._installed = False
    if self._client is not None:
      from jax.experimental import multihost_utils
      self._reached = multihost_utils.reached_preemption_sync_point
      self._reached(start)   # this host's step id, before anything long (compiling the step)
      self._early = self._noticed_by_any_host()
      self._thread = threading.Thread(target=self._poll_service, name="preemption-watchdog", daemon=True)
      self._thread.start()
    elif threading.current_thread() is threading.main_thread():   # tests drive loops on other threads too
      self._early = False
      self._read, self._write = os.pipe()
      os.set_blocking(self._write, False)
      self._old_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
      self._old_handler = signal.signal(signal.SIGTERM, self._on_signal)
      self._installed = True
      self._thread = threading.Thread(target=self._wait_for_signal, name="sigterm-watchdog", daemon=True)
      self._thread.start()
    else:
      self._early, self._thread = False, None

  @property
  def several_processes(self) -> bool:
    return self._client is not None

  def stop_at(self, step: int) -> bool:
    """Called once after each step on every process: whether the run saves this step and stops."""
    if self._client is not None:
      if self._early or self._reached(step):
        self.preempted = True
    return self.preempted

  def requested(self) -> bool:
    """Whether to stop now, after evaluation or a probe: one process may (SIGTERM came meanwhile); several
    stop only at the agreed step."""
    return self.preempted

  def stopped_at_start(self) -> bool:
    """A notice came before every host had registered its step: all stop before the first step."""
    if self._early:
      self.preempted = True
    return self._early

  def _noticed_by_any_host(self) -> bool:
    from jax.experimental import multihost_utils
    flags = multihost_utils.process_allgather(np.int32(_has_key(self._client, _NOTICE_KEY)))
    return bool(np.asarray(flags).any())

  # -- the watchdog ----------------------------------------------------------------------------
  def _on_signal(self, *_):
    self.preempted = True

  def _wait_for_signal(self) -> None:
    while not self._done.is_set():
      data = os.read(self._read, 64)
      if not data or signal.SIGTERM in data:
        break
    if not self._done.is_set():
      self.preempted = True
      self._end_if_stuck()

  def _poll_service(self) -> None:
    while not self._done.wait(1.0):
      if _has_key(self._client, _NOTICE_KEY):
        self._end_if_stuck()
        return

  def _end_if_stuck(self) -> None:
    if self._done.wait(self.timeout_s) or self.phase == "save":
      return
    logging.error("preempted: the run is stuck in %s %.0f s after the notice; exiting without saving (the last "
                  "checkpoint is intact)", self.phase, self.timeout_s)
    try:
      self.on_stuck()
    except Exception as e:   # the save being written failed: the last committed checkpoint stays
      logging.error("%s", " ".join(str(e).split()))
    logging.flush()
    os._exit(1)

  def stop(self) -> None:
    self._done.set()
    if self._installed:
      signal.signal(signal.SIGTERM, self._old_handler)
      signal.set_wakeup_fd(self._old_fd)
      os.close(self._write)   # the watchdog's read returns: it sees `done` and ends
      self._thread.join(timeout=5)
      os.close(self._read)


def _has_key(client, key: str) -> bool:
  try:
    return client.key_value_try_get(key) is not None
  except Exception:   # NOT_FOUND is raised, not returned
    return False
