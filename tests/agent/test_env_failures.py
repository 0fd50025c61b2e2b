"""An environment that crashes (reset or step raises: an infrastructure failure, not a
mistake of the model) ends its episode, which is counted and left out of training under
reward.on_error=mask, and stops the run under fail; so does a tool whose sandbox process
dies, while a tool that raises stays an observation for the model."""

from __future__ import annotations

import importlib

import pytest

from ardea.agent.episodes import EnvironmentFailure, EpisodeRunner
from ardea.config import AgentConfig
from ardea.errors import ConfigError
from ardea.reward import RewardScorer
from ardea.rollout import SamplingParams

from .agent_testing import ScriptedEngine

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=4)
ROWS = [{"turns": 3}, {"turns": 3, "crash": "step"}, {"turns": 2, "crash": "reset"}]


def runner(engine, tokenizer, on_error="mask", env="CrashingEnv", retries=0):
    return EpisodeRunner(
        engine,
        tokenizer,
        AgentConfig(env=f"tests.agent.agent_testing.{env}", max_turns=4, retries=retries),
        group_size=2,
        params=PARAMS,
        seed=1,
        on_error=on_error,
    )


def test_crashed_episodes_are_counted_and_not_trained(engine, tokenizer):
    played = runner(engine, tokenizer).generate(ROWS, seed_index=0)
    errors = [e.error for e in played.episodes]
    assert errors[:2] == [None, None]
    assert errors[2:4] == ["step raised RuntimeError: sandbox died"] * 2
    assert errors[4:] == ["reset raised ConnectionError: sandbox unreachable"] * 2
    # row 0's two episodes play 3 turns each; the crashed ones leave no call behind
    assert len(played.calls) == 6 and {c.group_id for c in played.calls} == {0}
    rollout = runner(engine, tokenizer).score(played)
    assert rollout.batch.group_ids.tolist() == [0, 0]
    assert rollout.metrics["agent/env_failures"] == 4 / 6
    assert rollout.metrics["agent/turns_per_episode"] == 3.0  # over the two that ran
    assert not any(e.truncated for e in played.episodes[2:])


def test_a_crash_under_fail_stops_naming_the_row(engine, tokenizer):
    with pytest.raises(EnvironmentFailure, match=r"row \{'turns': 3, 'crash': 'step'\}.*died"):
        runner(engine, tokenizer, "fail").generate(ROWS[:2], seed_index=0)


def test_every_episode_crashing_stops_and_zero_is_refused(engine, tokenizer):
    with pytest.raises(EnvironmentFailure, match="every episode.*sandbox unreachable"):
        runner(engine, tokenizer).generate(ROWS[2:], seed_index=0)
    with pytest.raises(ConfigError, match="reward.on_error='zero' with an agent environment"):
        runner(engine, tokenizer, "zero")


def test_a_dead_tool_sandbox_fails_its_episode_not_the_model(tokenizer):
    call = '<tool_call>{{"name": "{}", "arguments": {{"x": 2}}}}</tool_call>'
    # turn 0: row 0 calls double, row 1 calls exit; turn 1: row 0 answers
    engine = ScriptedEngine(tokenizer, [call.format("double"), call.format("exit"), "4"])
    sandboxed = EpisodeRunner(
        engine,
        tokenizer,
        AgentConfig(
            env="tests.agent.agent_testing.SandboxEnv", max_turns=3, executor="process", retries=0
        ),  # fmt: skip
        group_size=1,
        params=PARAMS,
        seed=1,
    )
    played = sandboxed.generate([{"question": "a"}, {"question": "b"}], seed_index=0)
    good, dead = played.episodes
    assert good.error is None and good.reward == 1.0 and good.tool_errors == 0
    assert dead.error.startswith("step raised ToolSandboxError: tool 'exit': its process died")
    assert [m["content"] for m in good.messages if m["role"] == "tool"] == ["4"]
    rollout = sandboxed.score(played)
    assert rollout.metrics["agent/env_failures"] == 0.5
    assert rollout.batch.group_ids.tolist() == [0]  # only the good episode is trained


@pytest.mark.parametrize("crash", ["step", "reset"])
def test_a_transient_crash_is_played_again_as_if_it_had_not_happened(engine, tokenizer, crash):
    """The first episode to reach the crash (reset, or its second step) fails once; played
    again from a fresh environment with the same row and random numbers, every episode is
    the one a run without the crash plays, token for token, and the retry is counted."""
    # the class the runner builds by its dotted path (this module's relative import is
    # another module object under pytest's rootdir)
    importlib.import_module("tests.agent.agent_testing").FlakyEnv.crashed.clear()
    rows = [{"turns": 3}, {"turns": 3, "crash": crash, "flaky": "x"}]
    played = runner(engine, tokenizer, env="FlakyEnv", retries=1).generate(rows, seed_index=0)
    clean = runner(engine, tokenizer).generate([{"turns": 3}, {"turns": 3}], seed_index=0)
    assert [e.error for e in played.episodes] == [None] * 4
    assert [e.retries for e in played.episodes] == [0, 0, 1, 0]
    tokens = sorted((c.group_id, c.input_ids, c.output_ids) for c in played.calls)
    assert tokens == sorted((c.group_id, c.input_ids, c.output_ids) for c in clean.calls)
    assert len(tokens) == 12  # 4 episodes x 3 turns: the failed attempt's calls left out
    metrics = runner(engine, tokenizer).score(played).metrics
    assert metrics["agent/retries"] == 1 / 4 and metrics["agent/env_failures"] == 0.0


def test_a_crash_that_recurs_is_retried_then_masked_or_fatal(engine, tokenizer):
    played = runner(engine, tokenizer, retries=2).generate(ROWS[:2], seed_index=0)
    assert [e.retries for e in played.episodes] == [0, 0, 2, 2]
    assert played.episodes[2].error == "step raised RuntimeError: sandbox died"
    metrics = runner(engine, tokenizer).score(played).metrics
    assert metrics["agent/retries"] == 1.0 and metrics["agent/env_failures"] == 0.5
    with pytest.raises(EnvironmentFailure, match="on_error=fail, after 2 retries"):
        runner(engine, tokenizer, "fail", retries=2).generate(ROWS[:2], seed_index=0)


def test_reward_functions_add_terms_and_their_failures_mask_episodes(tokenizer):
    """Each episode's last reply is scored with its first user message and its row; the
    weighted term joins the environment's reward 1; a failed score fails the episode."""
    seen = []

    def length(prompts, completions, rows):
        seen.append((prompts, completions, rows))
        return [None if c == "oops" else float(len(c)) for c in completions]

    scorer = RewardScorer([(length, 0.5)], timeout_s=30.0, on_error="mask")
    engine = ScriptedEngine(tokenizer, ["abc", "oops"])
    scored = EpisodeRunner(
        engine,
        tokenizer,
        AgentConfig(env="tests.agent.agent_testing.SandboxEnv", max_turns=2),
        group_size=1,
        params=PARAMS,
        seed=1,
        scorer=scorer,
    )
    rows = [{"question": "a"}, {"question": "b"}]
    played = scored.generate(rows, seed_index=0)
    assert seen == [(["a", "b"], ["abc", "oops"], rows)]
    good, failed = played.episodes
    assert good.reward == 1.0 + 0.5 * 3 and good.error is None
    assert failed.error.startswith("reward functions failed: 'length'")
    rollout = scored.score(played)
    assert rollout.batch.rewards.tolist() == [2.5]  # the failed episode is not trained
    assert rollout.metrics["agent/env_failures"] == 0.5
    assert rollout.metrics["reward/length/failed_fraction"] == 0.5
