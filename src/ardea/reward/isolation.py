"""Running one user function call in a child process that can be killed (``executor:
process`` of tools and reward functions).

A thread cannot be stopped: a tool or reward function that hangs keeps its thread (and
whatever it holds) for the life of the run. In a child process the call is killed at its
timeout, and a call that ends its own process (``os._exit``, a crash in C code) is a failed
call, not a dead run. Each call forks the running process (the ``fork`` start method: the
function and its arguments are inherited, so closures and lambdas work and nothing is
pickled on the way in; the result comes back pickled through a pipe). Forking costs a few
milliseconds; a child that touches torch's thread pools after the fork may hang, which the
timeout then ends: keep such functions on threads.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class Outcome:
    """How a call ended: ``ok`` (``value``), ``error`` (it raised: ``error`` says what),
    ``timeout`` (killed at its timeout) or ``died`` (its process ended without an answer:
    ``error`` gives the exit code)."""

    status: str
    value: Any = None
    error: str = ""


def _child(send, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    try:
        result = ("ok", fn(*args, **kwargs))
    except BaseException as exc:  # reported to the parent, never lost in the child
        result = ("error", f"{type(exc).__name__}: {exc}")
    try:
        send.send(result)
    except Exception as exc:  # a value that does not pickle
        send.send(("error", f"its result cannot be sent back ({type(exc).__name__}: {exc})"))


def call_in_process(
    fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None, *, timeout_s: float
) -> Outcome:
    """``fn(*args, **kwargs)`` in a forked child, killed after ``timeout_s`` seconds."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, fn, args, kwargs or {}), daemon=True)
    child.start()
    send.close()  # the child holds the only writer: its end closes the pipe when it dies
    try:
        if not receive.poll(timeout_s):
            child.kill()
            child.join(KILL_WAIT_S)
            return Outcome("timeout")
        try:
            status, value = receive.recv()
        except EOFError:  # the process ended without answering
            child.join(KILL_WAIT_S)
            return Outcome("died", error=f"its process died (exit code {child.exitcode})")
        child.join(KILL_WAIT_S)
        return Outcome("ok", value) if status == "ok" else Outcome("error", error=value)
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
