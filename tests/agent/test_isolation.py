"""Tools and reward functions in child processes (``executor: process``): a call that hangs
is killed at its timeout, one that ends its own process fails that call only (a tool's: a
sandbox failure the episode runner handles), nothing is left running, and good calls give
what they give on threads."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from ardea.agent import ToolBox, ToolCall, ToolSandboxError
from ardea.config import AgentConfig
from ardea.config.reward import RewardConfig
from ardea.errors import ConfigError
from ardea.reward.scorer import RewardScorer


def sleeps_forever(x: int) -> str:
    while True:
        time.sleep(1)


def exits(x: int) -> str:
    os._exit(3)


def double(x: int) -> str:
    return str(2 * x)


#: the timeout of calls that must finish: long enough for a forked child on a loaded machine,
#: so that only the hanging call ever meets its (short) timeout
AMPLE_S = 60.0


def test_a_hung_tool_is_killed_and_a_crashing_one_contained():
    start = time.monotonic()
    hung = ToolBox({"hang": sleeps_forever}, timeout=0.5, executor="process").run(
        ToolCall("hang", {"x": 1})
    )
    assert time.monotonic() - start < AMPLE_S  # killed at its timeout, not waited for
    assert "timed out after 0.5 s (its process was killed)" in hung.error
    assert multiprocessing.active_children() == []
    box = ToolBox(
        {"exit": exits, "double": double, "closure": lambda x: f"seen {x}"},
        timeout=AMPLE_S, executor="process",
    )  # fmt: skip
    # a sandbox that dies is the infrastructure's failure, not an observation for the model
    with pytest.raises(ToolSandboxError, match=r"'exit': its process died \(exit code 3\)"):
        box.run(ToolCall("exit", {"x": 1}))
    assert box.run(ToolCall("double", {"x": 21})).content == "42"  # the box goes on
    assert box.run(ToolCall("closure", {"x": 5})).content == "seen 5"  # nothing pickled in
    assert multiprocessing.active_children() == []  # nothing left running


def test_reward_functions_in_processes_are_killed_not_abandoned():
    def hang(prompts, completions, rows):
        sleeps_forever(0)

    def crash(prompts, completions, rows):
        os._exit(4)

    def length(prompts, completions, rows):
        return [len(c) for c in completions]

    hanging = RewardScorer([(hang, 1.0)], timeout_s=0.5, on_error="zero", executor="process",
                           max_abandoned=0)  # fmt: skip
    others = RewardScorer([(crash, 1.0), (length, 0.5)], timeout_s=AMPLE_S, on_error="zero",
                          executor="process", max_abandoned=0)  # fmt: skip
    for _ in range(2):  # max_abandoned=0: a second batch runs only if nothing was abandoned
        result = hanging.score(["p", "p"], ["ab", "abcd"], [{}, {}])
        assert result.rewards == [0.0, 0.0] and result.counts["reward/timeouts"] == 2
        result = others.score(["p", "p"], ["ab", "abcd"], [{}, {}])
        assert result.rewards == [1.0, 2.0]
        assert result.counts["reward/timeouts"] == 0 and result.counts["reward/errors"] == 2
    assert multiprocessing.active_children() == []
    with pytest.raises(Exception, match=r"'crash' raised ChildProcessError: its process died"):
        RewardScorer([(crash, 1.0)], timeout_s=5, on_error="fail", executor="process").score(
            ["p"], ["c"], [{}]
        )


def test_executors_are_checked_with_the_config():
    with pytest.raises(ConfigError, match="reward.executor"):
        RewardConfig(executor="fork")
    with pytest.raises(ConfigError, match="agent.executor"):
        AgentConfig(executor="pool")
    assert RewardConfig(executor="process").executor == "process"
