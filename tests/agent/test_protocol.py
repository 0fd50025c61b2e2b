"""The chat-completions options agent frameworks send, in process: stop sequences, content
parts, n > 1, tool_choice, parallel_tool_calls; empty replies; ``keep_tokens`` with a
template that rewrites earlier turns (a Qwen3-style empty think block, written for the test:
no model hub here), down to the turn-level advantages."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from ardea.agent import HistoryRewriteError, RecordingClient
from ardea.agent.stop_strings import cut_at
from ardea.algo import compute_advantages
from ardea.config import PPOConfig
from ardea.data import TrajectoryBatch

from .agent_testing import ScriptedEngine

USER = [{"role": "user", "content": "guess 1-8"}]
CALL = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
REPO = Path(__file__).parents[2]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_cut_at_counts_tokens_through_the_match(tokenizer):
    """One token per character: "ab STOP cd" holds STOP at characters 3..6, so 7 tokens."""
    assert cut_at(tokenizer, ids(tokenizer, "ab STOP cd"), ["STOP"], keep=False) == (7, "ab ")
    assert cut_at(tokenizer, ids(tokenizer, "ab STOP cd"), ["cd", "STOP"], keep=True) == (
        7,
        "ab STOP",
    )
    assert cut_at(tokenizer, ids(tokenizer, "ab"), ["STOP"], keep=False) is None


def test_stop_cuts_the_text_and_the_recorded_tokens(tokenizer):
    engine = ScriptedEngine(tokenizer, ["4\nObservation: x", "5"])
    client = RecordingClient(engine, tokenizer)
    first = client.chat.completions.create(messages=USER, stop=["Observation:"], logprobs=True)
    (call,) = client.interactions
    assert first.choices[0].message.content == "4\n"
    assert first.choices[0].finish_reason == "stop"
    assert call.output_ids == ids(tokenizer, "4\nObservation:")  # through the match
    assert len(first.choices[0].logprobs.content) == len(call.output_ids) == 14
    assert first.usage.completion_tokens == 14
    messages = [*USER, first.choices[0].message.model_dump(), {"role": "user", "content": "more"}]
    client.chat.completions.create(messages=messages)
    child = client.interactions[1]
    added = tokenizer.decode(child.input_ids[len(call.tokens) :])
    # the turn end the model did not write (it stopped at the sequence), then the new turn
    assert added == "<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    (row,) = client.export()
    b = TrajectoryBatch.from_trajectories([row], pad_token_id=0)
    assert b.input_ids[0][b.loss_mask[0]].tolist() == call.output_ids + child.output_ids


def test_content_as_text_parts_is_joined(tokenizer):
    engine = ScriptedEngine(tokenizer, ["4"])
    client = RecordingClient(engine, tokenizer)
    parts = [{"type": "text", "text": "guess "}, {"type": "text", "text": "1-8"}]
    client.chat.completions.create(messages=[{"role": "user", "content": parts}])
    assert tokenizer.decode(engine.prompts[0]).endswith(
        "guess 1-8<|im_end|>\n<|im_start|>assistant\n"
    )


def test_n_choices_are_one_engine_call_each_recorded(tokenizer):
    engine = ScriptedEngine(tokenizer, ["1", "2", "3", "4"])
    client = RecordingClient(engine, tokenizer)
    reply = client.chat.completions.create(messages=USER, n=3)
    assert engine.calls == 1 and engine.prompts[0] == engine.prompts[1] == engine.prompts[2]
    assert [c.message.content for c in reply.choices] == ["1", "2", "3"]
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.id for c in client.interactions] == [f"{reply.id}:{k}" for k in range(3)]
    client.set_reward(reply.id, 1.0, choice=2)
    assert [c.reward for c in client.interactions] == [0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="has 3 choices"):
        client.set_reward(reply.id, 1.0)
    # a conversation goes on from the choice it was given
    messages = [*USER, reply.choices[1].message.model_dump(), {"role": "user", "content": "up"}]
    client.chat.completions.create(messages=messages)
    assert client.interactions[-1].parent is client.interactions[1]


def test_tool_choice_none_keeps_the_call_as_text(tokenizer):
    client = RecordingClient(ScriptedEngine(tokenizer, [CALL]), tokenizer)
    reply = client.chat.completions.create(messages=USER, tools=[TOOL], tool_choice="none")
    assert reply.choices[0].message.content == CALL and not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "stop"


def test_required_tool_choice_unmet_is_returned_as_sampled_and_counted(tokenizer):
    client = RecordingClient(ScriptedEngine(tokenizer, ["no call", CALL]), tokenizer)
    first = client.chat.completions.create(messages=USER, tools=[TOOL], tool_choice="required")
    assert first.choices[0].message.content == "no call" and client.tool_choice_unmet == 1
    named = {"type": "function", "function": {"name": "f"}}
    second = client.chat.completions.create(messages=USER, tools=[TOOL], tool_choice=named)
    assert second.choices[0].message.tool_calls[0].function.name == "f"
    assert client.tool_choice_unmet == 1


def test_parallel_tool_calls_false_ends_the_reply_after_the_first_call(tokenizer):
    client = RecordingClient(ScriptedEngine(tokenizer, ["a" + CALL + CALL]), tokenizer)
    reply = client.chat.completions.create(messages=USER, tools=[TOOL], parallel_tool_calls=False)
    (call,) = reply.choices[0].message.tool_calls
    assert client.interactions[0].output_ids == ids(tokenizer, "a" + CALL)
    assert reply.choices[0].finish_reason == "tool_calls"


def test_an_empty_reply_left_out_of_the_history_continues_the_conversation(tokenizer):
    """The Agents SDK drops an empty assistant message: the next request still continues
    the call (one row), the empty turn's tokens (its <|im_end|>) kept."""
    engine = ScriptedEngine(tokenizer, ["", "5"])
    client = RecordingClient(engine, tokenizer)
    client.chat.completions.create(messages=USER)
    client.chat.completions.create(messages=[*USER, {"role": "user", "content": "go on"}])
    first, second = client.interactions
    assert second.parent is first and second.input_ids[: len(first.tokens)] == first.tokens
    (row,) = client.export()
    assert row.segments[1].token_ids == tuple(first.output_ids)


# a Qwen3-style template: the generation prompt opens an empty think block, which earlier
# assistant turns lose once a user message follows them
THINKING = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}"
    "{% endif %}{% endfor %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' and loop.index0 > ns.last_user %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{{ m['content'] or '' }}"
    "{% for call in m.get('tool_calls') or [] %}"
    "{% set f = call['function'] if 'function' in call else call %}"
    "{% set args = f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) %}"
    "{{ '<tool_call>{\"name\": ' + (f['name'] | tojson) + ', \"arguments\": ' + args"
    " + '}</tool_call>' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}"
    "{% endif %}"
)


def three_turns(client):
    """Tool call, tool result, answer, a new user message, answer."""
    messages = [{"role": "user", "content": "2+3?"}]
    for extra in ([{"role": "tool", "tool_call_id": None, "content": "5"}],
                  [{"role": "user", "content": "and 2+4?"}], []):  # fmt: skip
        reply = client.chat.completions.create(messages=messages, tools=[TOOL])
        message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        for m in extra:
            calls = message.get("tool_calls") or []
            messages.append({**m, "tool_call_id": calls[0]["id"]} if m["role"] == "tool" else m)
    return messages


def qwen3_family_template() -> str:
    """A real Qwen3-family chat template: MiniCPM-V 4.5's, which vLLM ships (Qwen3's own
    thinking logic: the generation prompt opens an empty think block when thinking is off,
    and assistant turns before the last user query are rendered without it)."""
    found = sorted(
        (REPO / ".venv-vllm").glob(
            "lib/python3*/site-packages/vllm/transformers_utils/chat_templates/"
            "template_minicpmv45.jinja"
        )
    )
    assert found, "vLLM's CPU build is not installed: make setup-vllm installs it"
    return found[0].read_text()


@pytest.mark.parametrize("template", ["written", "qwen3-family"])
def test_keep_tokens_keeps_a_rewriting_template_conversation_one_row(tokenizer, template):
    thinking = copy.deepcopy(tokenizer)
    thinking.chat_template = THINKING if template == "written" else qwen3_family_template()
    with pytest.raises(HistoryRewriteError):
        three_turns(RecordingClient(ScriptedEngine(thinking, [CALL, "5", "6"]), thinking))
    engine = ScriptedEngine(thinking, [CALL, "5", "6"])
    client = RecordingClient(engine, thinking, history="keep_tokens")
    three_turns(client)
    calls = client.interactions
    assert [c.parent for c in calls] == [None, calls[0], calls[1]]
    for parent, child in zip(calls, calls[1:]):
        assert child.input_ids[: len(parent.tokens)] == parent.tokens
    # what each call adds: its new messages, rendered as after an assistant turn
    added = thinking.decode(calls[2].input_ids[len(calls[1].tokens) :])
    assert added.startswith("\n<|im_start|>user\nand 2+4?<|im_end|>\n<|im_start|>assistant\n")
    assert added.endswith("<think>\n\n</think>\n\n")  # the generation prompt, thinking off
    client.set_reward(calls[2].id, 2.0)
    (row,) = client.export()
    b = TrajectoryBatch.from_trajectories([row], pad_token_id=0)
    assert b.input_ids[0][b.loss_mask[0]].tolist() == sum(engine.outputs, [])
    assert engine.prompts == [c.input_ids for c in calls]  # the engine saw what is trained
    # turn-level GAE steps once per turn: zero values, γ = 1, λ = 0.5, outcome R = 2 give
    # A = λ² R, λ R, R = 0.5, 1, 2 on turns 0, 1, 2
    cfg = PPOConfig(gae_timestep_unit="turn", gae_lambda=0.5)
    out = compute_advantages(b.advantage_inputs(values=torch.zeros(b.loss_mask.shape)), cfg)
    turns, adv = b.turn_ids[0, 1:], out.advantages[0, :-1]
    assert [sorted(set(adv[turns == k].tolist())) for k in range(3)] == [[0.5], [1.0], [2.0]]
