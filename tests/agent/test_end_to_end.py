"""A multi-turn environment with tool calls through the recording client, in process (the
episode runner) and over HTTP (agent code on the openai client): token by token, only
model-generated tokens are trained, with the right turn ids; tool output never is; the
behaviour log-probs equal log-probs recomputed on the exported rows (fp32, 1e-5)."""

from __future__ import annotations

import json
import re

import httpx
import openai
import torch

from ardea.agent import RecordingClient, ToolCall, make_env
from ardea.agent.episodes import EpisodeRunner
from ardea.agent.server import ChatServer
from ardea.config import AgentConfig
from ardea.data import TrajectoryBatch
from ardea.rollout import SamplingParams

from .agent_testing import ForcedEngine, recomputed_logprobs

SYMBOL = {"plus": "+", "minus": "-", "times": "*"}


def scripted_agent(prompt: str) -> str:
    """Calls the calculator on the last question (a misspelt tool for "minus"), then
    answers the last tool result."""
    if prompt.rstrip().endswith("<|im_start|>assistant") and "<|im_start|>tool" in prompt:
        result = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", prompt)[-1]
        return result if result.lstrip("-").isdigit() else "0"
    a, word, b = re.findall(r"what is (\d+) (\w+) (\d+)\?", prompt)[-1]
    name = "calc" if word == "minus" else "calculator"
    call = {"name": name, "arguments": {"expression": f"{a}{SYMBOL[word]}{b}"}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


ROWS = [
    {"question": "what is 12 plus 7?", "answer": 19},
    {"question": "what is 9 minus 4?", "answer": 5},
]


def check_row(batch, row, calls, tokenizer, model):
    """Token by token: prompt, each call's output (turn k), the context between."""
    ids = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
    expected_mask, expected_turn = [], []
    known = 0
    for turn, call in enumerate(calls):
        assert ids[: len(call.input_ids)] == call.input_ids  # the prompt it was served
        context = len(call.input_ids) - known
        expected_mask += [False] * context + [True] * len(call.output_ids)
        expected_turn += [-1] * context + [turn] * len(call.output_ids)
        assert ids[len(call.input_ids) : len(call.tokens)] == call.output_ids
        known = len(call.tokens)
    assert len(ids) == known
    assert batch.loss_mask[row, :known].tolist() == expected_mask
    assert batch.turn_ids[row, :known].tolist() == expected_turn
    text = [tokenizer.decode([t]) for t in ids]
    for match in re.finditer(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", "".join(text)):
        start = len(
            tokenizer("".join(text)[: match.start(1)], add_special_tokens=False)["input_ids"]
        )
        span = batch.loss_mask[row, start : start + len(match.group(1))]
        assert span.numel() and not span.any()  # tool output is never trained on
    reference = recomputed_logprobs(model, batch.input_ids[row : row + 1, :known])[0]
    mask = batch.loss_mask[row, :known]
    torch.testing.assert_close(
        batch.logprobs[row, :known][mask], reference[mask], atol=1e-5, rtol=0
    )


def test_episodes_in_process(model, tokenizer):
    engine = ForcedEngine(model, tokenizer, scripted_agent)
    runner = EpisodeRunner(
        engine,
        tokenizer,
        AgentConfig(env="calculator", max_turns=3),
        group_size=2,
        params=SamplingParams(max_new_tokens=80),
    )
    played = runner.generate(ROWS, seed_index=0)
    assert engine.calls == 2  # two turns, every waiting episode in one engine call
    rollout = runner.score(played)
    b = rollout.batch
    assert b.rows == 4 and b.group_ids.tolist() == [0, 0, 1, 1]
    assert b.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    m = rollout.metrics
    assert m["agent/turns_per_episode"] == 2 and m["agent/success_rate"] == 0.5
    assert m["agent/tool_calls"] == 1 and m["agent/tool_errors"] == 0.5
    leaves = [c for c in played.calls if c.parent is not None]
    for row, leaf in enumerate(leaves):
        check_row(b, row, leaf.chain(), tokenizer, model)
    error_reply = leaves[2].input_ids  # the unknown tool's error is what the model saw
    assert "error: unknown tool 'calc'" in tokenizer.decode(error_reply)


def play_over_http(api, base_url, env_name, row):
    """Agent code written for the OpenAI API: it runs the tool calls itself."""
    env = make_env(env_name, max_turns=3)
    messages = env.reset(row)
    for _ in range(env.max_turns):
        reply = api.chat.completions.create(model="ardea", messages=messages, tools=env.tools)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            reward = float(int(message.content) == row["answer"])
            httpx.post(f"{base_url}/rewards", json={"completion_id": reply.id, "reward": reward})
            return reward
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            result = env.toolbox.run(ToolCall(call.function.name, args))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result.content})
    return 0.0


def test_agent_code_over_http(model, tokenizer):
    engine = ForcedEngine(model, tokenizer, scripted_agent)
    client = RecordingClient(engine, tokenizer, max_tokens=80)
    with ChatServer(client) as server:
        api = openai.OpenAI(base_url=server.url, api_key="-", max_retries=0)
        rewards = [play_over_http(api, server.url, "calculator", row) for row in ROWS]
    assert rewards == [1.0, 0.0]
    b = TrajectoryBatch.from_trajectories(client.export(), pad_token_id=0)
    assert b.rows == 2 and b.rewards.tolist() == rewards
    leaves = [c for c in client.interactions if c.parent is not None]
    for row, leaf in enumerate(leaves):
        check_row(b, row, leaf.chain(), tokenizer, model)
