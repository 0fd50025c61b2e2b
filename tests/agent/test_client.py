"""The recording client in process: conversations through a real engine become one
trajectory each (the seed's turn-level cases through the real path), history rewrites are
detected, concurrent calls are batched."""

from __future__ import annotations

import threading

import pytest
import torch

from ardea.agent import HistoryRewriteError, RecordingClient
from ardea.algo import compute_advantages
from ardea.config import AgentConfig, PPOConfig
from ardea.data import TrajectoryBatch

from .agent_testing import ScriptedEngine, recomputed_logprobs

CONTEXT = "<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"


def two_turn_batch(engine, tokenizer, reward=2.0):
    """A conversation of two calls (the first cut at the length limit), exported."""
    client = RecordingClient(engine, tokenizer, max_tokens=6)
    messages = [{"role": "user", "content": "guess 1-8"}]
    first = client.chat.completions.create(messages=messages, seed=3, logprobs=True)
    messages += [first.choices[0].message.model_dump(), {"role": "user", "content": "higher"}]
    second = client.chat.completions.create(messages=messages, seed=4, max_tokens=5)
    client.set_reward(second.id, reward)
    batch = TrajectoryBatch.from_trajectories(client.export(), pad_token_id=0)
    return client, first, second, batch


def test_conversation_is_one_trajectory_with_turns_and_exact_logprobs(engine, model, tokenizer):
    client, first, second, b = two_turn_batch(engine, tokenizer)
    calls = client.interactions
    assert b.rows == 1 and first.choices[0].finish_reason == "length"
    ids = b.input_ids[0].tolist()
    n0, n1 = len(calls[0].input_ids), len(calls[0].output_ids)
    assert ids[: n0 + n1] == calls[0].input_ids + calls[0].output_ids  # parent kept as is
    context = ids[n0 + n1 : len(calls[1].input_ids)]
    assert tokenizer.decode(context) == "<|im_end|>\n" + CONTEXT  # the turn end it did not write
    assert ids[len(calls[1].input_ids) :] == calls[1].output_ids
    expected_turns = [-1] * n0 + [0] * n1 + [-1] * len(context) + [1] * len(calls[1].output_ids)
    assert b.turn_ids[0].tolist() == expected_turns
    assert b.loss_mask[0].tolist() == [t >= 0 for t in expected_turns]
    lp = [x.logprob for x in first.choices[0].logprobs.content]
    assert lp == calls[0].logprobs
    reference = recomputed_logprobs(model, b.input_ids)
    torch.testing.assert_close(b.logprobs[b.loss_mask], reference[b.loss_mask], atol=1e-5, rtol=0)


def test_turn_level_gae_steps_once_per_turn_on_a_served_conversation(engine, tokenizer):
    """Zero values, γ = 1, λ = 0.5, outcome R = 2: A = (γλ) R on turn 0, R on turn 1."""
    *_, b = two_turn_batch(engine, tokenizer)
    cfg = PPOConfig(gae_timestep_unit="turn", gae_lambda=0.5)
    out = compute_advantages(b.advantage_inputs(values=torch.zeros(b.loss_mask.shape)), cfg)
    turns = b.turn_ids[0, 1:]  # the turn of the token each next-token position emits
    adv = out.advantages[0, :-1]
    assert torch.all(adv[turns == 0] == 1.0) and torch.all(adv[turns == 1] == 2.0)
    assert torch.all(adv[turns < 0] == 0.0)


def test_lambda_adapts_to_the_turn_count(engine, tokenizer):
    """VAPO λ = 1 − 1/(α · turns) with α = 1 and 2 turns is 0.5, whatever the token count."""
    *_, b = two_turn_batch(engine, tokenizer)
    cfg = PPOConfig(
        gae_timestep_unit="turn",
        gae_lambda="ardea.algo.lambda_fn.vapo_length_adaptive_gae",
        gae_lambda_kwargs={"alpha": 1.0},
    )
    out = compute_advantages(b.advantage_inputs(values=torch.zeros(b.loss_mask.shape)), cfg)
    turns, adv = b.turn_ids[0, 1:], out.advantages[0, :-1]
    assert torch.all(adv[turns == 0] == 1.0) and torch.all(adv[turns == 1] == 2.0)


def test_kl_stays_token_local_in_turn_mode(engine, tokenizer):
    """With kl_ctl = 1 and a zero reference, each action's advantage is its turn's
    advantage plus its own −(log π_behav − 0); returns stay task-only."""
    *_, b = two_turn_batch(engine, tokenizer)
    b = b.pin(ref_logprobs=torch.zeros(b.loss_mask.shape))
    cfg = PPOConfig(gae_timestep_unit="turn", kl_ctl=1.0)
    out = compute_advantages(b.advantage_inputs(values=torch.zeros(b.loss_mask.shape)), cfg)
    act = b.loss_mask[0, 1:]
    torch.testing.assert_close(out.returns[0, :-1][act], torch.full((int(act.sum()),), 2.0))
    expected = 2.0 - b.logprobs[0, 1:][act]
    torch.testing.assert_close(out.advantages[0, :-1][act], expected, atol=1e-6, rtol=0)


# A template that drops <think> blocks of earlier assistant turns (as Qwen3's does).
THINK_STRIPPING = (
    "{% for m in messages %}{% set c = m['content'] or '' %}"
    "{% if m['role'] == 'assistant' and not loop.last and '</think>' in c %}"
    "{% set c = c.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def think_conversation(tokenizer, history):
    tokenizer = _with_template(tokenizer, THINK_STRIPPING)
    engine = ScriptedEngine(tokenizer, ["<think>hmm</think>4", "6"])
    client = RecordingClient(engine, tokenizer, history=history)
    messages = [{"role": "user", "content": "guess 1-8"}]
    first = client.chat.completions.create(messages=messages)
    messages += [first.choices[0].message.model_dump(), {"role": "user", "content": "higher"}]
    return client, messages


def _with_template(tokenizer, template):
    import copy

    out = copy.deepcopy(tokenizer)
    out.chat_template = template
    return out


def test_a_template_that_strips_think_blocks_is_detected(tokenizer):
    client, messages = think_conversation(tokenizer, "error")
    with pytest.raises(HistoryRewriteError, match="rewrote.*<think>.*new_trajectory"):
        client.chat.completions.create(messages=messages)


def test_new_trajectory_policy_splits_at_the_stripped_turn(tokenizer):
    client, messages = think_conversation(tokenizer, "new_trajectory")
    second = client.chat.completions.create(messages=messages)
    client.set_reward(second.id, 1.0)
    b = TrajectoryBatch.from_trajectories(client.export(), pad_token_id=0)
    assert b.rows == 2
    first_text = tokenizer.decode(b.input_ids[0][b.attention_mask[0].bool()])
    assert first_text.endswith("<think>hmm</think>4<|im_end|>")
    second_ids = b.input_ids[1][b.attention_mask[1].bool()]
    assert tokenizer.decode(second_ids) == (
        "<|im_start|>user\nguess 1-8<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        + CONTEXT
        + "6<|im_end|>"
    )
    assert b.turn_ids[1][b.loss_mask[1]].unique().tolist() == [0]  # its own turn 0
    assert b.rewards.tolist() == [0.0, 1.0]


def test_a_changed_reply_is_detected(tokenizer):
    engine = ScriptedEngine(tokenizer, ["4", "6"])
    client = RecordingClient(engine, tokenizer)
    messages = [{"role": "user", "content": "guess 1-8"}]
    client.chat.completions.create(messages=messages)
    messages += [{"role": "assistant", "content": "5"}, {"role": "user", "content": "higher"}]
    with pytest.raises(HistoryRewriteError, match="differs from that call's reply"):
        client.chat.completions.create(messages=messages)


def test_concurrent_calls_sample_what_they_sample_alone(engine, tokenizer):
    """Four seeded calls made at once (decoded together by the engine, each joining the
    running ones) reply the tokens each replies alone, with its recorded log-probs within
    float32 rounding of its lone ones (a batch of one sums its matmuls in another order: the
    1e-4 bound of test_workflows' concurrency test); each is recorded once."""
    messages = [[{"role": "user", "content": f"guess 1-{i + 2}"}] for i in range(4)]
    together = RecordingClient(engine, tokenizer, max_tokens=4)
    replies = {}

    def play(i):
        replies[i] = together.chat.completions.create(messages=messages[i], seed=7)

    threads = [threading.Thread(target=play, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alone = RecordingClient(engine, tokenizer, max_tokens=4)
    for m in messages:
        alone.chat.completions.create(messages=m, seed=7)
    assert len(together.interactions) == 4
    by_prompt = {tuple(c.input_ids): c for c in together.interactions}
    for call in alone.interactions:
        other = by_prompt[tuple(call.input_ids)]
        assert other.output_ids == call.output_ids
        torch.testing.assert_close(
            torch.tensor(other.logprobs), torch.tensor(call.logprobs), rtol=0, atol=1e-4
        )
    assert sorted(r.id for r in replies.values()) == sorted(c.id for c in together.interactions)


def test_unsupported_options_are_errors(engine, tokenizer):
    client = RecordingClient(engine, tokenizer)
    msg = [{"role": "user", "content": "hi"}]
    with pytest.raises(TypeError, match="frequency_penalty"):
        client.chat.completions.create(messages=msg, frequency_penalty=0.5)
    with pytest.raises(ValueError, match="stream_options is only allowed with stream=True"):
        client.chat.completions.create(messages=msg, stream_options={"include_usage": True})
    with pytest.raises(ValueError, match=r"unsupported key\(s\) \['continuous_usage'\]"):
        client.chat.completions.create(
            messages=msg, stream=True, stream_options={"continuous_usage": True}
        )


def test_streaming_sends_the_recorded_reply_as_chunks(tokenizer):
    """stream=True: the reply's content, tool call and log-probs in one delta, then the
    finish reason, then (include_usage) the usage; the call is recorded as without it."""
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    client = RecordingClient(ScriptedEngine(tokenizer, [f"ok{call}"]), tokenizer)
    stream = client.chat.completions.create(
        messages=[{"role": "user", "content": "what is 2 plus 3?"}],
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
        user="agent-7",
    )
    with stream:
        chunks = list(stream)
    (recorded,) = client.interactions
    assert [c.id for c in chunks] == [recorded.id] * 3
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    delta = chunks[0].choices[0].delta
    assert (delta.role, delta.content) == ("assistant", "ok")
    (tool,) = delta.tool_calls
    assert (tool.index, tool.function.name) == (0, "calculator")
    assert tool.function.arguments == '{"expression": "2+3"}'
    # "ok" + the call + <|im_end|>: one character token each, every one at log-prob -0.5
    assert [t.logprob for t in chunks[0].choices[0].logprobs.content] == [-0.5] * (len(call) + 3)
    assert chunks[0].choices[0].finish_reason is None
    assert chunks[1].choices[0].finish_reason == "tool_calls"
    assert chunks[2].choices == [] and chunks[2].usage.completion_tokens == len(call) + 3
    assert chunks[2].usage.prompt_tokens == len(recorded.input_ids)
    assert chunks[0].usage is None and chunks[1].usage is None
    assert recorded.user == "agent-7"


def test_conversations_with_equal_histories_stay_apart(tokenizer):
    """Two guess_number games (targets 2 and 3) play the same first two guesses; the one
    that finds 2 ends, the other goes on: each row keeps its own calls and reward."""
    from ardea.agent.episodes import EpisodeRunner
    from ardea.rollout import SamplingParams

    engine = ScriptedEngine(tokenizer, ["4", "4", "2", "2", "3"])
    runner = EpisodeRunner(
        engine,
        tokenizer,
        AgentConfig(env="guess_number", max_turns=3),
        group_size=1,
        params=SamplingParams(max_new_tokens=4),
    )
    rollout = runner.score(runner.generate([{"target": 2}, {"target": 3}], seed_index=0))
    b = rollout.batch
    assert b.rows == 2 and b.rewards.tolist() == [1.0, 1.0]
    assert [int(b.turn_ids[i].max()) + 1 for i in range(2)] == [2, 3]


def test_metadata_names_the_call_continued(tokenizer):
    engine = ScriptedEngine(tokenizer, ["4", "4", "6"])
    client = RecordingClient(engine, tokenizer)
    messages = [{"role": "user", "content": "guess 1-8"}]
    first = client.chat.completions.create(messages=messages)
    second = client.chat.completions.create(messages=messages)
    messages += [first.choices[0].message.model_dump(), {"role": "user", "content": "higher"}]
    third = client.chat.completions.create(messages=messages, metadata={"parent_id": second.id})
    assert client.get(third.id).parent is client.get(second.id)


def test_a_prompt_beyond_the_context_is_an_error_naming_it(tokenizer):
    """An asked max_tokens that does not fit is an error; the client's default is cut to
    what the context has left (the model holds 512; the prompt is 28 tokens)."""
    from .test_bad_requests import Limited

    engine = Limited(tokenizer, ["4"])
    client = RecordingClient(engine, tokenizer, max_tokens=500)
    messages = [{"role": "user", "content": "guess 1-8"}]
    with pytest.raises(ValueError, match=r"max_tokens=500 that exceeds the model's context of 512"):
        client.chat.completions.create(messages=messages, max_tokens=500)
    seen = []
    engine.generate = lambda prompts, params: (
        seen.append(params) or Limited.generate(engine, prompts, params)
    )
    client.chat.completions.create(messages=messages)
    assert len(engine.prompts[0]) == 28 and seen[0].max_new_tokens == 512 - 28
