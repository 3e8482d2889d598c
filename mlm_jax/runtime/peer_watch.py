"""Telling at once that another process of the run is gone, whatever this one is doing (docs/multihost.md).

JAX's coordination service notices a lost process only at its heartbeat timeout, and then ends the
others with a C++ abort (exit 134 and a stack trace) unless a collective of theirs failed first with
an error that becomes one line; a process between collectives (fetching metrics, writing a
checkpoint) gets the abort. So every process keeps one TCP link to process 0, opened after
`jax.distributed.initialize`: the kernel closes a process's sockets when it dies, even at kill -9,
and keepalive probes end a link to a lost host before the heartbeat timeout. A link that closes
without a farewell is a lost process: one line and exit 1 (`exit_peer_lost`). A process that ends on
purpose (finished, preempted) says farewell first; one that ends with an error leaves at once
(`leave_after_error`), both from one_line_errors.run. Where the link cannot be made (a firewall),
the run goes on without it and says so once.
"""
from __future__ import annotations

import os
import secrets
import selectors
import socket
import sys
import threading
from typing import NoReturn

from mlm_jax.runtime.teardown import flush_all

_REPORTING = threading.Lock()   # the main thread and the watch may both see the loss: one line


def exit_peer_lost(e: BaseException) -> NoReturn:
  """One line, then exit 1 at once: the distributed runtime's own shutdown would wait for the lost process
  at a barrier and then abort with a C++ stack trace."""
  import jax
  _REPORTING.acquire()   # a second caller waits here until the first has ended the process
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  why = " ".join((lines[0] if lines else type(e).__name__).split())[:300]
  print(f"error: process {jax.process_index()} of {jax.process_count()} stops: another process of this run is gone "
        f"({why}). Nothing newer was saved; the last complete checkpoint is intact: rerun the same "
        "command on every host to resume from it", file=sys.stderr)
  flush_all()
  os._exit(1)


_KEY = "mlm_jax/peer_watch"   # process 0's port and the run's token, in the coordination service's store
_FAREWELL = b"bye"


class _Watch:
  """This process's links: process 0 holds one to each other process, every other process one to 0."""

  def __init__(self, process_id: int, timeout_s: int):
    self.process_id, self.timeout_s = process_id, timeout_s
    self.links: list[socket.socket] = []
    self.lock = threading.Lock()
    self.leaving = False   # this process said farewell: links that close now are not a loss

  def keep(self, sock: socket.socket) -> None:
    """Keepalive probes that end a link to a lost host within ~5/6 of the heartbeat timeout."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", self.timeout_s // 3), ("TCP_KEEPINTVL", self.timeout_s // 6),
                        ("TCP_KEEPCNT", 3)):
      if hasattr(socket, name):
        sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), max(1, value))
    with self.lock:
      self.links.append(sock)

  def farewell(self) -> None:
    with self.lock:
      self.leaving = True
      for sock in self.links:
        try:
          sock.sendall(_FAREWELL)
        except OSError:
          pass

  def lost(self, who: int, error: OSError | None) -> None:
    """Process `who`'s link closed without a farewell (`error`: what closed it, if the read failed)."""
    with self.lock:
      if self.leaving:
        return
    from mlm_jax.errors import PeerLost
    exit_peer_lost(PeerLost(f"process {who} ended without a farewell" + (f": {error}" if error else "")))

  def serve(self, server: socket.socket, token: bytes) -> None:
    """Process 0: accepts each process's link (a stranger without the run's token is dropped), then waits
    for one to close."""
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    who: dict[socket.socket, int] = {}   # a link -> its process, once it has said the token
    said_farewell: set[socket.socket] = set()
    while True:
      for key, _ in sel.select():
        sock = key.fileobj
        if sock is server:
          conn, _ = server.accept()
          sel.register(conn, selectors.EVENT_READ)
          continue
        data, error = _receive(sock)
        if sock not in who:   # the first message: "TOKEN PROCESS_ID"
          parts = data.split()
          if len(parts) >= 2 and parts[0] == token and parts[1].isdigit():
            who[sock] = int(parts[1])
            self.keep(sock)
            if _FAREWELL in parts[2:]:   # it ended on purpose before this read its first message
              said_farewell.add(sock)
          else:
            sel.unregister(sock)
            sock.close()
          continue
        if _FAREWELL in data:
          said_farewell.add(sock)
        if not data:
          sel.unregister(sock)
          if sock not in said_farewell:
            self.lost(who[sock], error)

  def link(self, client, coordinator_host: str, token_wait_ms: int) -> socket.socket | None:
    """Every other process: its link to process 0, made before the run goes on (a process lost at any
    later moment is then seen), or None where it cannot be made."""
    from absl import logging
    published = client.blocking_key_value_get(_KEY, token_wait_ms)
    if published == "none":   # process 0 has no port (it said why)
      return None
    try:
      port, token = published.split()
      sock = socket.create_connection((coordinator_host, int(port)), timeout=10)
      sock.settimeout(None)
      sock.sendall(f"{token} {self.process_id}\n".encode())
    except OSError as e:   # the run goes on without the watch
      logging.warning("no link to process 0 for telling a lost process at once (%s): a lost process ends "
                      "this one at the heartbeat timeout instead", e)
      return None
    self.keep(sock)
    return sock

  def follow(self, sock: socket.socket) -> None:
    """Every other process: waits for process 0's link to close."""
    said_farewell = False
    while True:
      data, error = _receive(sock)
      said_farewell = said_farewell or _FAREWELL in data
      if not data:
        if not said_farewell:
          self.lost(0, error)
        return


def _receive(sock: socket.socket) -> tuple[bytes, OSError | None]:
  """What the other end sent next; b'' once the link is closed, with the error that closed it, if any."""
  try:
    return sock.recv(256), None
  except OSError as e:
    return b"", e


_watch: _Watch | None = None


def start(heartbeat_timeout_s: int) -> None:
  """Opens this process's links once jax.distributed is initialized (several processes only)."""
  global _watch
  import jax
  from jax._src import distributed as jax_distributed
  if jax.process_count() == 1 or _watch is not None:
    return
  state = jax_distributed.global_state
  watch = _Watch(jax.process_index(), heartbeat_timeout_s)
  if watch.process_id == 0:
    try:
      if socket.has_dualstack_ipv6():
        server = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
      else:
        server = socket.create_server(("", 0))
    except OSError as e:
      from absl import logging
      logging.warning("no port for the other processes' links (%s): a lost process ends the others at the "
                      "heartbeat timeout instead", e)
      state.client.key_value_set(_KEY, "none")   # the others go on without waiting for a port
      return
    token = secrets.token_hex(16)
    state.client.key_value_set(_KEY, f"{server.getsockname()[1]} {token}")
    target, args = watch.serve, (server, token.encode())
  else:
    host = state.coordinator_address.rsplit(":", 1)[0].strip("[]")
    sock = watch.link(state.client, host, max(heartbeat_timeout_s, 120) * 1000)
    if sock is None:
      return
    target, args = watch.follow, (sock,)
  threading.Thread(target=target, args=args, name="peer_watch", daemon=True).start()
  _watch = watch


def farewell() -> None:
  """This process ends on purpose: the others must not take its links closing for a loss."""
  if _watch is not None:
    _watch.farewell()


def leave_after_error(status: int) -> None:
  """This process of several ends with an error (its line is out): exit now, without a farewell, so the
  others see it gone and stop at once. A normal exit would first wait at jax.distributed's shutdown
  barrier for the others, which go on training, until its timeout. One process alone: returns."""
  if _watch is not None:
    flush_all()
    os._exit(status)
