"""Who runs the in-process engine's decode steps, and when: one step at a time, by the
scheduler thread or by a batch call in its own thread, never while the engine is held for a
weight update or an abort (:class:`StepLoop`).

- A request (``submit``) is served by the scheduler thread, started by the first one and
  left once the engine has been idle for ``IDLE_S`` seconds.
- A batch call (``generate``) steps in its caller's thread until its rows are done, its
  rows decoded with every other running row; the scheduler thread waits meanwhile. The
  decode then runs under the caller's torch settings and OpenMP threads: measured on a
  2-core CPU, a second thread's OpenMP team beside the caller's cost 30 % of the engine's
  throughput.
- :meth:`StepLoop.exclusively` holds the engine between two steps (``update_weights``,
  ``abort``, ``close``); steps wait for it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import torch

IDLE_S = 30.0  # an idle scheduler thread ends after this long (the next request starts one)
POLL_S = 0.05  # how often a batch call waiting for another's step checks its own rows


class StepLoop:
    """The engine's steps (module docstring).

    Args:
        take: ``take(waiting) -> (joining, left)``: the waiting rows that join the next step.
        iterate: runs one step with the rows that join it.
        running: whether rows are being decoded.
        fail: ``fail(joining, error)``: a step raised; every row it touched fails with it.
    """

    def __init__(
        self,
        take: Callable[[list[Any]], tuple[list[Any], list[Any]]],
        iterate: Callable[[list[Any]], None],
        running: Callable[[], bool],
        fail: Callable[[list[Any], BaseException], None],
    ) -> None:
        self.take, self.iterate, self.running, self.fail = take, iterate, running, fail
        self.cond = threading.Condition()
        self.waiting: list[Any] = []
        self.closed = False
        self._thread: threading.Thread | None = None
        self._stepping = False
        self._drivers = 0  # batch calls stepping in their own thread
        self._exclusive = 0  # callers waiting to hold the engine between two steps

    def enqueue(self, rows: list[Any], *, drive: bool = False) -> None:
        """Queue ``rows``; unless the caller will :meth:`drive` them, the scheduler thread
        serves them (started when none runs)."""
        with self.cond:
            if self.closed:
                raise RuntimeError("the generation engine was closed")
            self.waiting += rows
            if not drive and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ardea-engine", daemon=True)
                self._thread.start()
            self.cond.notify_all()

    @contextlib.contextmanager
    def exclusively(self):
        """Hold the engine between two steps; the batches' tensors are inference tensors,
        changed only in inference mode."""
        with self.cond, torch.inference_mode():
            self._exclusive += 1
            try:
                while self._stepping:
                    self.cond.wait()
                yield
            finally:
                self._exclusive -= 1
                self.cond.notify_all()

    def drive(self, handles: list[Any]) -> None:
        """Step in the calling thread until ``handles`` are done (module docstring)."""
        with self.cond:
            self._drivers += 1
        try:
            while True:
                with self.cond:
                    while not all(h.done() for h in handles) and not self._ready():
                        self.cond.wait(POLL_S)  # another driver's step, or an update
                    if all(h.done() for h in handles):
                        return
                    joining = self._begin()
                self._step(joining)
        finally:
            with self.cond:
                self._drivers -= 1
                self.cond.notify_all()

    def _ready(self) -> bool:
        """Whether a step may start: work waits, and nothing else holds the engine."""
        busy = self.closed or self._exclusive or self._stepping
        return not busy and bool(self.waiting or self.running())

    def _run(self) -> None:
        while True:
            with self.cond:
                while not (self._ready() and not self._drivers):
                    idle = not self.cond.wait(IDLE_S) and not (self.waiting or self.running())
                    if self.closed or idle:
                        self._thread = None  # the next request starts the thread again
                        return
                joining = self._begin()
            self._step(joining)

    def _begin(self) -> list[Any]:
        """Mark a step as running; the rows that join it (called holding the lock)."""
        self._stepping = True
        joining, self.waiting = self.take(self.waiting)
        return joining

    def _step(self, joining: list[Any]) -> None:
        try:
            self.iterate(joining)
        except BaseException as exc:  # noqa: BLE001 - handed to every request it broke
            self.fail(joining, exc)
        finally:
            with self.cond:
                self._stepping = False
                self.cond.notify_all()
