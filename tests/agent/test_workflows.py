"""Agent workflows (user code against ``openai.AsyncOpenAI``) as rollouts: the calls are
served in lockstep, so a workflow that plays guess-the-number samples exactly what the
environment runner samples, in process and over HTTP; failures, timeouts and a blocked
event loop are counted, never trained, never a hang."""

from __future__ import annotations

import importlib
import json
import re
import time
from pathlib import Path

import pytest
import torch

from ardea.agent.builtin_envs import GuessNumber
from ardea.agent.episodes import EpisodeRunner
from ardea.agent.workflows import GRACE_S, WorkflowError, WorkflowRunner, load_workflow
from ardea.config import AgentConfig
from ardea.errors import ConfigError
from ardea.rollout import SamplingParams

from .agent_testing import ForcedEngine

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=3)
ROWS = [{"target": t, "high": 8} for t in (1, 5, 8, 2)]
HERE = "tests.agent.workflows_for_tests"
EXAMPLE = str(Path(__file__).parents[2] / "examples/agents/guess_number_openai.py") + ":run"


RUNNER_OPTIONS = ("group_size", "params", "seed", "on_error", "locked")


def runner(engine, tokenizer, name, **options):
    """The workflow ``name``'s runner; ``options``: the runner's own and ``agent.*`` fields."""
    own = {"group_size": 2, "params": PARAMS, "seed": 3}
    own |= {k: v for k, v in options.items() if k in RUNNER_OPTIONS}
    workflow = EXAMPLE if name == "guess_number" else f"{HERE}.{name}"
    agent = {k: v for k, v in options.items() if k not in RUNNER_OPTIONS}
    return WorkflowRunner(engine, tokenizer, AgentConfig(workflow=workflow, **agent), **own)


def by_episode(calls):
    """Each episode's calls (output ids, log-probs), in episode order."""
    out: dict[int, list] = {}
    for c in calls:
        out.setdefault(c.episode, []).append((c.output_ids, c.logprobs))
    return [out[k] for k in sorted(out)]


@pytest.mark.parametrize("transport", ["in_process", "http"])
def test_a_workflow_samples_what_the_environment_runner_samples(engine, tokenizer, transport):
    """The guess_number environment and the same game as openai-SDK code (the example
    examples/agents/guess_number_openai.py): equal rows, token for token, log-prob for
    log-prob (each episode's k-th call has turn k's seed and the episode's row of random
    numbers)."""
    env = EpisodeRunner(
        engine,
        tokenizer,
        AgentConfig(env="guess_number", env_args={"high": 8}, max_turns=4),
        group_size=2,
        params=PARAMS,
        seed=3,
    )
    workflow = runner(engine, tokenizer, "guess_number", transport=transport)
    played, expected = workflow.generate(ROWS, seed_index=4), env.generate(ROWS, seed_index=4)
    got, want = workflow.score(played).batch, env.score(expected).batch
    for field in ("input_ids", "loss_mask", "turn_ids", "logprobs", "rewards", "group_ids"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert [e.success for e in played.episodes] == [e.success for e in expected.episodes]
    assert len(played.calls) == len(expected.calls) > len(ROWS) * 2  # several turns each


def test_a_runner_builds_its_app_and_server_once(engine, tokenizer, monkeypatch):
    """Two rollout calls of one runner over HTTP: one FastAPI app (built with the runner),
    one server (started by the first call, stopped by close), and each call's episodes
    released to the engine turn by turn (a release per turn, at least 3 turns)."""
    import ardea.agent.lockstep as lockstep
    import ardea.agent.workflows as workflows

    apps, servers, locksteps = [], [], []
    build, start, attach = (
        workflows.build_app,
        workflows.ChatServer.start,
        lockstep.Lockstep.attach,
    )
    monkeypatch.setattr(workflows, "build_app", lambda *a, **k: apps.append(1) or build(*a, **k))
    monkeypatch.setattr(workflows.ChatServer, "start", lambda s: servers.append(s) or start(s))
    monkeypatch.setattr(
        lockstep.Lockstep, "attach", lambda s, e: locksteps.append(s) or attach(s, e)
    )
    w = runner(engine, tokenizer, "guess_number", transport="http")
    played = [w.generate(ROWS, seed_index=k) for k in (0, 1)]
    assert len(apps) == 1 and len(servers) == 1 and servers[0]._thread.is_alive()
    w.close()
    assert not servers[0]._thread.is_alive()
    assert len(locksteps) == 2
    for p, s in zip(played, locksteps):
        assert len(p.calls) > len(ROWS) * 2
        assert s.releases >= max(e.turns for e in p.episodes) >= 3  # one release per turn


def test_concurrency_changes_the_batches_not_the_samples(engine, tokenizer):
    """One episode at a time (a batch of one call each) samples the tokens of all at once;
    log-probs agree to float32 rounding: a batch of one may sum its matmuls in another
    order, and a float32 dot product of K terms moves by at most K·2⁻²⁴·Σ|xᵢyᵢ| (Higham);
    with K ≤ 128 (the MLP width), O(1) terms and two layers feeding a log-softmax, that
    is ≤ 128 · 6e-8 · 2 · 2 ≈ 3e-5 per log-prob, so 1e-4 is a bound, not a fit."""
    together = runner(engine, tokenizer, "guess_number").generate(ROWS, seed_index=1)
    alone = runner(engine, tokenizer, "guess_number", max_concurrency=1)
    one_by_one = alone.generate(ROWS, seed_index=1)
    a, b = by_episode(together.calls), by_episode(one_by_one.calls)
    assert [[ids for ids, _ in e] for e in a] == [[ids for ids, _ in e] for e in b]
    for x, y in zip(a, b):
        for (_, lp), (_, lq) in zip(x, y):
            torch.testing.assert_close(torch.tensor(lp), torch.tensor(lq), rtol=0, atol=1e-4)


def test_failed_episodes_are_counted_and_not_trained(engine, tokenizer, capfd):
    played = runner(engine, tokenizer, "raises_on_odd_targets").generate(ROWS, seed_index=0)
    rollout = runner(engine, tokenizer, "raises_on_odd_targets").score(played)
    failed = [e.error is not None for e in played.episodes]
    assert failed == [True, True, True, True, False, False, False, False]  # targets 1, 5 odd
    assert "RuntimeError: odd target 1" in played.episodes[0].error
    assert rollout.metrics["agent/workflow_failures"] == 0.5
    assert sorted(set(rollout.batch.group_ids.tolist())) == [2, 3]  # rows 8 and 2 only
    assert rollout.batch.rows == 4
    err = capfd.readouterr().err
    assert err.count("odd target 1") == 1 and "agent/workflow_failures" in err


def test_on_error_fail_stops_with_the_row_and_the_error(engine, tokenizer):
    strict = runner(engine, tokenizer, "raises_on_odd_targets", on_error="fail")
    with pytest.raises(
        WorkflowError, match=r"\{'target': 1, 'high': 8\}.*RuntimeError: odd target 1"
    ):
        strict.generate(ROWS, seed_index=0)


def test_a_workflow_past_its_timeout_is_cancelled(engine, tokenizer):
    """Target 1's episodes sleep for an hour after their call: cancelled at 1 s, counted as
    timeouts; the others are trained."""
    slow = runner(engine, tokenizer, "sleeps_forever_on_target_1", workflow_timeout_s=1.0)
    start = time.perf_counter()
    played = slow.generate(ROWS, seed_index=0)
    assert time.perf_counter() - start < 10
    metrics = slow.score(played).metrics
    assert metrics["agent/workflow_timeouts"] == metrics["agent/workflow_failures"] == 0.25
    assert "agent.workflow_timeout_s" in played.episodes[0].error


def test_a_transient_failure_is_played_again_as_if_it_had_not_happened(engine, tokenizer):
    """The first episode of each target fails after its first call, once; played again
    with the same row and random numbers (agent.retries=1, the default), every episode
    makes the calls a run without failures makes, token for token, and is trained."""
    flaky = importlib.import_module(HERE)  # the module the runner loads by its dotted path
    flaky.FLAKED.clear()
    rows = [{**r, "flaky": True} for r in ROWS]
    retried = runner(engine, tokenizer, "flaky_two_turns")
    played = retried.generate(rows, seed_index=0)
    clean = runner(engine, tokenizer, "flaky_two_turns").generate(ROWS, seed_index=0)
    assert [e.error for e in played.episodes] == [None] * 8
    assert [e.retries for e in played.episodes] == [1, 0] * 4  # each target's first episode
    calls = sorted((c.group_id, c.input_ids, c.output_ids) for c in played.calls)
    assert calls == sorted((c.group_id, c.input_ids, c.output_ids) for c in clean.calls)
    assert len(calls) == 16  # 8 episodes x 2 calls: the failed attempts' calls left out
    metrics = retried.score(played).metrics
    assert metrics["agent/retries"] == 0.5 and metrics["agent/workflow_failures"] == 0.0
    flaky.FLAKED.clear()
    once = runner(engine, tokenizer, "flaky_two_turns", retries=0).generate(rows, seed_index=0)
    assert [e.error is not None for e in once.episodes] == [True, False] * 4


def test_a_blocked_event_loop_is_given_up(engine, tokenizer, monkeypatch):
    """Synchronous sleep inside async code blocks every episode: the runner gives up after
    the episodes' time plus a grace period and says why."""
    monkeypatch.setattr("ardea.agent.workflows.GRACE_S", 1.0)
    assert GRACE_S > 1.0  # the real grace is longer than the test's
    blocked = runner(engine, tokenizer, "blocks_the_loop", workflow_timeout_s=0.5)
    start = time.perf_counter()
    with pytest.raises(WorkflowError, match="every episode failed.*event loop was blocked"):
        blocked.generate(ROWS[:1], seed_index=0)
    assert time.perf_counter() - start < 5  # the workflow sleeps 8 s in its abandoned thread


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("asks_another_temperature", "temperature=0.5 differs from this run's rollout"),
        ("returns_text", "reward must be a finite number, got 'good'"),
    ],
)
def test_what_training_cannot_use_fails_the_episode(engine, tokenizer, name, message):
    with pytest.raises(WorkflowError, match=message):
        runner(engine, tokenizer, name).generate(ROWS[:1], seed_index=0)


def test_evaluation_lets_a_workflow_choose_its_temperature(engine, tokenizer):
    played = runner(engine, tokenizer, "asks_another_temperature", locked=False).generate(
        ROWS[:1], seed_index=0
    )
    assert all(e.error is None for e in played.episodes)


def test_parallel_calls_are_numbered_in_arrival_order(engine, tokenizer):
    """Two calls at once, then one continuing the first: every episode exports two rows
    (the two-turn conversation and the lone call), each with the episode's reward. Which of
    the two concurrent calls arrives first is the event loop's choice, and a call's number
    (so its seed) is its place in arrival order: two runs may number them differently, so
    only what does not depend on it is checked — three calls per episode, one of them cut
    at its max_tokens=2."""
    first = runner(engine, tokenizer, "parallel_calls").generate(ROWS[:2], seed_index=0)
    for calls in by_episode(first.calls):
        assert len(calls) == 3 and min(len(ids) for ids, _ in calls) <= 2
    batch = runner(engine, tokenizer, "parallel_calls").score(first).batch
    assert batch.rows == 2 * 4 and batch.rewards.tolist() == [0.5] * 8
    turns = sorted(int(t.max()) for t in batch.turn_ids)
    assert turns == [0] * 4 + [1] * 4


def test_workflow_names_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="no file"):
        load_workflow(f"{tmp_path}/missing.py:run")
    script = tmp_path / "agent.py"
    script.write_text("def run(client, row):\n    return 1.0\n")
    with pytest.raises(ConfigError, match="is not an async function"):
        load_workflow(f"{script}:run")
    with pytest.raises(ConfigError, match="defines no 'play'"):
        load_workflow(f"{script}:play")
    script.write_text("async def run(client, row):\n    return 1.0\n")
    assert load_workflow(f"{script}:run").__name__ == "run"
    with pytest.raises(ConfigError, match="cannot import module"):
        load_workflow("no_such_package.run")


def test_the_example_rows_are_the_environments():
    """examples/data/guess_number_*.jsonl hold the guess_number environment's rows for
    data.seed=0 (so the workflow config trains on the environment config's games)."""
    data = Path(__file__).parents[2] / "examples/data"
    for split, count in (("train", 2000), ("eval", 16)):
        lines = (data / f"guess_number_{split}.jsonl").read_text().splitlines()
        rows = [json.loads(x) for x in lines]
        expected = GuessNumber.rows(count, 0, split=split, high=16)
        assert [r["target"] for r in rows] == [r["target"] for r in expected]
        assert {r["high"] for r in rows} == {16}


AGENTS_SDK = str(Path(__file__).parents[2] / "examples/agents/guess_number_agents_sdk.py") + ":run"


def bisect_with_the_tool(prompt: str) -> str:
    """A player that calls the guess tool with the midpoint of what the answers so far
    leave (the conversation is read from the prompt's text)."""
    low, high = 1, int(re.search(r"guess 1-(\d+)", prompt).group(1))
    guesses = [int(g) for g in re.findall(r'"number": (\d+)\}\}</tool_call>', prompt)]
    answers = re.findall(r"<\|im_start\|>tool\n(\w+)<\|im_end\|>", prompt)
    for guess, answer in zip(guesses, answers):
        low, high = (guess + 1, high) if answer == "higher" else (low, guess - 1)
    call = {"name": "guess", "arguments": {"number": (low + high) // 2}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def test_an_agents_sdk_agent_with_a_function_tool_trains_what_the_environment_would(
    model, tokenizer
):
    """The Agents SDK example (examples/agents/guess_number_agents_sdk.py) and the
    guess_number environment with its guess tool, played by the same bisecting player:
    the same trajectories (the tool's answers are context, the calls are trained), every
    game won."""
    engine = ForcedEngine(model, tokenizer, bisect_with_the_tool)
    env = EpisodeRunner(
        engine,
        tokenizer,
        AgentConfig(env="guess_number", env_args={"high": 8, "tool": True}, max_turns=4),
        group_size=2,
        params=PARAMS,
    )
    sdk = WorkflowRunner(
        engine, tokenizer, AgentConfig(workflow=AGENTS_SDK), group_size=2, params=PARAMS
    )
    played, expected = sdk.generate(ROWS, seed_index=0), env.generate(ROWS, seed_index=0)
    got, want = sdk.score(played).batch, env.score(expected).batch
    for field in ("input_ids", "loss_mask", "turn_ids", "logprobs", "rewards"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert got.rewards.tolist() == [1.0] * 8
    guesses = [e.info["guesses"] for e in played.episodes]
    assert guesses == [3, 3, 3, 3, 4, 4, 2, 2]  # bisection of 1..8: targets 1, 5, 8, 2
    trained = [tokenizer.decode(ids[mask]) for ids, mask in zip(got.input_ids, got.loss_mask)]
    assert sorted(t.count("<tool_call>") for t in trained) == [2, 2, 3, 3, 3, 3, 4, 4]
    assert not any("higher" in t or "lower" in t for t in trained)  # tool output: context


def test_call_export_gives_every_call_the_episode_reward_discounted(engine, tokenizer):
    """export=call: one row per call; the last call of each conversation has the episode's
    reward (0.5) and a call continued by another gets γ times its child's: the first call
    of the two-turn conversation 0.5 · 0.5 = 0.25, the lone parallel call 0.5."""
    calls = runner(engine, tokenizer, "parallel_calls", export="call", reward_discount=0.5)
    batch = calls.score(calls.generate(ROWS[:1], seed_index=0)).batch
    assert batch.rows == 2 * 3 and sorted(batch.rewards.tolist()) == [0.25, 0.25] + [0.5] * 4
