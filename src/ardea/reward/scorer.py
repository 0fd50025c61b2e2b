"""Scoring completions with a weighted sum of reward functions, safely.

``RewardScorer.score`` calls every function once on the whole batch and returns
``rewards[i] = sum_k weight_k * value_k[i]``. A call that raises, outlives ``timeout_s``,
returns something other than one number (or None) per completion, or returns None or
NaN/inf for a completion is a *problem*, and its samples *failed*: with
``on_error="fail"`` it raises :class:`RewardError` naming the function, the problem and the
first offending sample; otherwise the failed samples score 0 for that function, are
counted, and are marked (``ScoreResult.failed``): under ``on_error="mask"`` (the default)
the rollout leaves them out of training (:class:`~ardea.rollout.RolloutRunner`), under
``"zero"`` they are trained with that 0. Counts are numbers of samples:

- ``reward/errors``    samples of calls that raised or returned a wrong length / non-number
- ``reward/timeouts``  samples of calls that did not return within ``timeout_s``
- ``reward/nonfinite`` values that were NaN or +-inf
- ``reward/skipped``   values that were None (the function could not score the sample)

Why threads and not processes: each call runs in its own daemon thread, all functions of
a batch at once, and ``score`` waits at most ``timeout_s`` in total. Threads cost
microseconds, accept any callable (closures over a task or a model, which a process pool
would have to pickle), and need no fork of a process that holds torch threads (which can
deadlock) nor a spawn that re-imports torch (seconds). The price: Python cannot kill a
thread, so a call that times out is *abandoned* and keeps running (and holding the GIL
while it computes) until it returns; its result is discarded. Daemon threads never block
interpreter exit. If more than ``max_abandoned`` abandoned calls are still running, the
next ``score`` raises :class:`RewardError` whatever ``on_error`` says, because a function
that hangs every time would otherwise pile up threads. ``executor="process"`` trades the
microseconds for a fork per call (:mod:`ardea.reward.isolation`): the call is killed at the
timeout and nothing is abandoned. Functions run concurrently, so
they must not share unsynchronized state with each other.

Token ids: ``score(..., token_ids=TokenIds(...))`` hands the batch's prompt and completion ids
to the functions that declare a ``token_ids`` keyword (:func:`ardea.reward.takes_token_ids`);
a caller with text only leaves it out and they get ``token_ids=None`` (they score the text).
The other functions are called with the three lists alone.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ardea.config.fields import check_choice
from ardea.config.reward import EXECUTORS, ON_ERROR
from ardea.errors import ArdeaError, ConfigError
from ardea.reward.isolation import KILL_WAIT_S, call_in_process
from ardea.reward.registry import RewardFn, takes_token_ids
from ardea.reward.token_ids import TokenIds

COUNT_KEYS = ("reward/errors", "reward/timeouts", "reward/nonfinite", "reward/skipped")


class RewardError(ArdeaError):
    """A reward function failed (raised, timed out, wrong output, NaN) under on_error=fail."""


@dataclass
class ScoreResult:
    """Scores of one batch.

    Attributes:
        rewards: weighted sum per sample; a function's problem counts 0 in it.
        per_function: each function's unweighted value per sample, by name.
        counts: the four ``reward/*`` sample counts of the module docstring.
        failed: per sample, whether any function failed on it.
        failed_by_function: per function name, the samples it failed on.
        first_problem: the first failure, as ``'<function>' <what happened>`` ("" if none).
        metrics: what functions said about the batch (:class:`~ardea.reward.ScoredValues`),
            as ``reward/<function>/<name>``.
        seconds: wall time of the ``score`` call.
    """

    rewards: list[float]
    per_function: dict[str, list[float]]
    counts: dict[str, int]
    failed: list[bool]
    failed_by_function: dict[str, int]
    first_problem: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @classmethod
    def join(cls, parts: Sequence[ScoreResult]) -> ScoreResult:
        """The scores of ``parts`` (consecutive shares of one batch, scored side by side)
        as one result: the per-sample lists concatenated in order, the counts, the failures
        and the functions' batch totals (:class:`~ardea.reward.ScoredValues`) added, the
        first part's first problem, and the slowest part's ``seconds``."""
        names = parts[0].per_function
        return cls(
            rewards=[r for p in parts for r in p.rewards],
            per_function={k: [v for p in parts for v in p.per_function[k]] for k in names},
            counts=_added([p.counts for p in parts]),
            failed=[f for p in parts for f in p.failed],
            failed_by_function=_added([p.failed_by_function for p in parts]),
            first_problem=next((p.first_problem for p in parts if p.first_problem), ""),
            metrics=_added([p.metrics for p in parts]),
            seconds=max(p.seconds for p in parts),
        )


def failure_metrics(scored: ScoreResult) -> dict[str, float]:
    """``reward/failed_fraction`` (completions any reward function failed on) and, per
    function, ``reward/<name>/failed_fraction``, with what the functions said about the
    batch (``scored.metrics``, e.g. an LLM judge's tokens)."""
    n = max(len(scored.failed), 1)
    out = {"reward/failed_fraction": sum(scored.failed) / n}
    out |= {
        f"reward/{name}/failed_fraction": k / n for name, k in scored.failed_by_function.items()
    }
    return out | scored.metrics


def _added(dicts: Sequence[dict]) -> dict:
    """The sum of ``dicts`` key by key (a key missing from one counts 0 there)."""
    out: dict = {}
    for d in dicts:
        for key, value in d.items():
            out[key] = out.get(key, 0) + value
    return out


@dataclass
class _Problem:
    kind: str  # one of COUNT_KEYS' suffixes: errors, timeouts, nonfinite
    what: str
    index: int
    samples: list[int]


class _Call:
    """One reward-function call running in a daemon thread (with ``timeout_s``: the thread
    waits for the call in a child process, killed at the timeout)."""

    def __init__(
        self, name: str, fn: RewardFn, args: tuple, kwargs: dict, timeout_s: float | None
    ) -> None:
        self.value: object = None
        self.error: BaseException | None = None
        self.killed = False  # process executor: killed at its timeout
        self.done = threading.Event()
        run = self._run if timeout_s is None else self._run_in_process
        self.thread = threading.Thread(
            target=run, args=(fn, args, kwargs, timeout_s), name=f"ardea-reward-{name}", daemon=True
        )
        self.thread.start()

    def _run(self, fn: RewardFn, args: tuple, kwargs: dict, _: None) -> None:
        try:
            self.value = fn(*args, **kwargs)
        except BaseException as err:  # reported to the caller, never lost in the thread
            self.error = err
        finally:
            self.done.set()

    def _run_in_process(self, fn: RewardFn, args: tuple, kwargs: dict, timeout_s: float) -> None:
        try:
            outcome = call_in_process(fn, args, kwargs, timeout_s=timeout_s)
            self.value = outcome.value
            self.killed = outcome.status == "timeout"
            if outcome.status in ("error", "died"):
                self.error = ChildProcessError(outcome.error)
        finally:
            self.done.set()


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(value: object, limit: int = 160) -> str:
    """``repr(value)`` cut to ``limit`` characters."""
    return _clip(repr(value), limit)


def _name_of(fn: RewardFn) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def _unique_names(functions: Sequence[tuple[RewardFn, float]]) -> list[str]:
    names: list[str] = []
    for fn, _ in functions:
        name, k = _name_of(fn), 2
        while name in names:
            name, k = f"{_name_of(fn)}_{k}", k + 1
        names.append(name)
    return names


def _values(
    call: _Call, finished: bool, n: int, timeout_s: float
) -> tuple[list[float], list[_Problem]]:
    """The call's values (0 where there was a problem) and its problems."""
    everything = list(range(n))
    if call.killed:
        what = f"did not return within timeout_s={timeout_s:g} (its process was killed)"
        return [0.0] * n, [_Problem("timeouts", what, 0, everything)]
    if not finished:
        what = f"did not return within timeout_s={timeout_s:g} (its thread is abandoned)"
        return [0.0] * n, [_Problem("timeouts", what, 0, everything)]
    if call.error is not None:
        err = call.error
        what = f"raised {type(err).__name__}: {_clip(' '.join(str(err).split()), 300)}"
        return [0.0] * n, [_Problem("errors", what, 0, everything)]
    out = call.value
    if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__len__"):
        what = f"returned a {type(out).__name__}, not a list of {n} numbers"
        return [0.0] * n, [_Problem("errors", what, 0, everything)]
    if len(out) != n:
        what = f"returned {len(out)} values for {n} completions"
        return [0.0] * n, [_Problem("errors", what, 0, everything)]
    values, problems = [0.0] * n, []
    for i, raw in enumerate(out):
        if raw is None:
            problems.append(_Problem("skipped", f"returned None at index {i}", i, [i]))
            continue
        try:
            if isinstance(raw, (str, bytes)):
                raise TypeError
            value = float(raw)
        except (TypeError, ValueError):
            problems.append(_Problem("errors", f"returned {_short(raw, 60)} at index {i}", i, [i]))
            continue
        if not math.isfinite(value):
            problems.append(_Problem("nonfinite", f"returned {value} at index {i}", i, [i]))
            continue
        values[i] = value
    return values, problems


def _check_batch(prompts: list, completions: list, rows: list, token_ids: TokenIds | None) -> int:
    """The batch size ``n``; ValueError unless every list (and ``token_ids``'s) has ``n``."""
    n = len(completions)
    if len(prompts) != n or len(rows) != n:
        raise ValueError(
            f"score() needs one prompt and one row per completion; got {len(prompts)} "
            f"prompts, {n} completions, {len(rows)} rows"
        )
    if token_ids is not None and not len(token_ids.prompts) == len(token_ids.completions) == n:
        raise ValueError(
            f"score() needs the ids of each of the {n} completions and their prompts; got "
            f"{len(token_ids.completions)} completions' and {len(token_ids.prompts)} prompts'"
        )
    return n


class RewardScorer:
    """Weighted sum of reward functions with per-call timeouts (see the module docstring).

    Args:
        functions: ``(fn, weight)`` pairs; a function's name is its ``__name__`` (names
            that repeat get ``_2``, ``_3``, ...).
        timeout_s: how long one ``score`` call waits for the functions (> 0).
        on_error: ``"fail"`` raises :class:`RewardError`; ``"mask"`` and ``"zero"`` score 0,
            count and mark the failed samples (module docstring).
        max_abandoned: timed-out calls allowed to still be running before ``score``
            refuses to go on.
        executor: ``thread`` (module docstring) or ``process``: each call in a forked child
            process killed at the timeout, so nothing is abandoned and a function that ends
            its process fails that call only (:mod:`ardea.reward.isolation`).
    """

    def __init__(
        self,
        functions: Sequence[tuple[RewardFn, float]],
        *,
        timeout_s: float,
        on_error: str = "mask",
        max_abandoned: int = 16,
        executor: str = "thread",
    ) -> None:
        if not functions:
            raise ConfigError("RewardScorer needs at least one (function, weight) pair")
        for fn, weight in functions:
            if not callable(fn):
                raise ConfigError(f"reward function {fn!r} is not callable")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise ConfigError(f"weight {weight!r} of {_name_of(fn)!r} must be a number")
            if not math.isfinite(weight):
                raise ConfigError(f"weight {weight!r} of {_name_of(fn)!r} must be finite")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
            raise ConfigError(f"timeout_s={timeout_s!r} must be a positive number of seconds")
        check_choice("on_error", on_error, ON_ERROR)
        check_choice("executor", executor, EXECUTORS)
        if (
            isinstance(max_abandoned, bool)
            or not isinstance(max_abandoned, int)
            or max_abandoned < 0
        ):
            raise ConfigError(f"max_abandoned={max_abandoned!r} must be an integer >= 0")
        self.functions = [(fn, float(w)) for fn, w in functions]
        self.names = _unique_names(functions)
        self.takes_ids = [takes_token_ids(fn) for fn, _ in self.functions]
        self.timeout_s = float(timeout_s)
        self.on_error = on_error
        self.max_abandoned = max_abandoned
        self.executor = executor
        self._abandoned: list[_Call] = []
        self._one_batch = threading.Lock()  # batches from several threads take turns

    def _check_abandoned(self) -> None:
        self._abandoned = [c for c in self._abandoned if not c.done.is_set()]
        if len(self._abandoned) > self.max_abandoned:
            names = sorted({c.thread.name.removeprefix("ardea-reward-") for c in self._abandoned})
            raise RewardError(
                f"{len(self._abandoned)} timed-out reward calls ({', '.join(names)}) are still "
                f"running in abandoned threads; a reward function hangs: fix it or raise "
                f"reward.timeout_s (now {self.timeout_s:g})"
            )

    def _fail(self, name: str, problem: _Problem, prompts, completions) -> RewardError:
        i = problem.index
        where = "" if len(problem.samples) == 1 else f" on a batch of {len(problem.samples)};"
        return RewardError(
            f"reward function {name!r} {problem.what};{where} first offending sample #{i}: "
            f"prompt={_short(prompts[i])} completion={_short(completions[i])} "
            "(reward.on_error=mask leaves such samples out of training, zero trains them with "
            "0; both count them)"
        )

    def score(
        self,
        prompts: list[str],
        completions: list[str],
        rows: list[dict],
        *,
        token_ids: TokenIds | None = None,
    ) -> ScoreResult:
        """Score a batch; see the class and module docstrings for problems and counts.
        ``token_ids``: the batch's ids, for the functions that ask for them (None: the
        caller has text only)."""
        start = time.monotonic()
        with self._one_batch:
            result = self._score(prompts, completions, rows, token_ids)
        result.seconds = time.monotonic() - start
        return result

    def _score(
        self,
        prompts: list[str],
        completions: list[str],
        rows: list[dict],
        token_ids: TokenIds | None,
    ) -> ScoreResult:
        n = _check_batch(prompts, completions, rows, token_ids)
        counts = dict.fromkeys(COUNT_KEYS, 0)
        if n == 0:
            return ScoreResult([], {name: [] for name in self.names}, counts, [],
                               dict.fromkeys(self.names, 0))  # fmt: skip
        self._check_abandoned()
        in_process = self.timeout_s if self.executor == "process" else None
        calls = [  # each call gets its own lists: one function cannot reorder another's
            _Call(name, fn, (list(prompts), list(completions), list(rows)),
                  {"token_ids": token_ids.copy() if token_ids else None} if ids else {},
                  in_process)
            for name, (fn, _), ids in zip(self.names, self.functions, self.takes_ids)
        ]  # fmt: skip
        # a child process is killed at the timeout: wait for the kill too (never abandoned)
        grace = KILL_WAIT_S + 1.0 if in_process else 0.0
        deadline = time.monotonic() + self.timeout_s + grace
        for call in calls:
            call.done.wait(max(0.0, deadline - time.monotonic()))
        finished = [call.done.is_set() for call in calls]  # decided once, at the deadline
        self._abandoned += [call for call, done in zip(calls, finished) if not done]
        rewards, per_function, failed, failed_by, first = [0.0] * n, {}, [False] * n, {}, ""
        metrics: dict[str, float] = {}
        for name, call, done, (_, weight) in zip(self.names, calls, finished, self.functions):
            values, problems = _values(call, done, n, self.timeout_s)
            said = getattr(call.value, "metrics", None) if done else None
            metrics |= {f"reward/{name}/{key}": float(v) for key, v in (said or {}).items()}
            if problems and self.on_error == "fail":
                raise self._fail(name, problems[0], prompts, completions)
            if problems and not first:
                first = f"{name!r} {problems[0].what}"
            bad: set[int] = set()
            for problem in problems:
                counts[f"reward/{problem.kind}"] += len(problem.samples)
                bad.update(problem.samples)
            for i in bad:
                failed[i] = True
            failed_by[name] = len(bad)
            per_function[name] = values
            rewards = [r + weight * v for r, v in zip(rewards, values)]
        return ScoreResult(rewards, per_function, counts, failed, failed_by, first, metrics)
