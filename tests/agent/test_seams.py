"""The agent layer's seams: which call a request continues (two conversations sharing a
reply, a few-shot turn that is not the model's, a turn the agent rewrote), the turn end kept
under keep_tokens after a stop sequence, one parse of each reply (a non-Hermes parser with a
built-in environment), one rendering per turn, and n > 1 streamed."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from ardea.agent import RecordingClient
from ardea.agent.episodes import EpisodeRunner
from ardea.agent.server import ChatServer
from ardea.config import AgentConfig
from ardea.data import TrajectoryBatch
from ardea.rollout import SamplingParams

from .agent_testing import ScriptedEngine

HELLO = [{"role": "user", "content": "hello"}]
TURN = "<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"


def test_two_conversations_sharing_their_first_reply_continue_their_own_calls(tokenizer):
    """Two conversations ask the same and get the same reply "4"; each continuation
    attaches to its own call (a call once continued is taken by no other), so the export
    is two rows of two turns each."""
    client = RecordingClient(ScriptedEngine(tokenizer, ["4", "4", "6", "7"]), tokenizer)
    for _ in range(2):
        client.chat.completions.create(messages=HELLO)
    follow = [*HELLO, {"role": "assistant", "content": "4"}, {"role": "user", "content": "more"}]
    for _ in range(2):
        client.chat.completions.create(messages=follow)
    calls = client.interactions
    assert [calls.index(c.parent) if c.parent else None for c in calls] == [None, None, 0, 1]
    rows = client.export()
    assert len(rows) == 2
    assert [[s.kind for s in r.segments].count("generated") for r in rows] == [2, 2]


def test_keep_tokens_closes_a_turn_cut_by_a_stop_sequence(tokenizer):
    """The reply stopped at "Observation:" (its tokens end there, no <|im_end|> generated):
    under keep_tokens the next turn still closes the assistant turn in the trained tokens."""
    client = RecordingClient(
        ScriptedEngine(tokenizer, ["4\nObservation: x", "5"]), tokenizer, history="keep_tokens"
    )
    first = client.chat.completions.create(messages=HELLO, stop=["Observation:"])
    messages = [*HELLO, first.choices[0].message.model_dump(), {"role": "user", "content": "more"}]
    client.chat.completions.create(messages=messages)
    parent, child = client.interactions
    assert tokenizer.decode(child.input_ids[len(parent.tokens) :]) == TURN
    (row,) = client.export()
    b = TrajectoryBatch.from_trajectories([row], pad_token_id=0)
    text = tokenizer.decode(b.input_ids[0].tolist())
    assert "4\nObservation:" + TURN in text


def test_a_few_shot_turn_is_not_glued_to_an_earlier_call(tokenizer):
    """keep_tokens: a new conversation whose hand-written assistant turn follows a prompt
    asked before is a new conversation (the engine sees the few-shot text); a turn the agent
    rewrote from the model's reply (it carries the reply's text) continues that call,
    marked, counted and visible in the export."""
    engine = ScriptedEngine(tokenizer, ["hi there", "ok", "fine"])
    client = RecordingClient(engine, tokenizer, history="keep_tokens")
    client.chat.completions.create(messages=HELLO)
    few_shot = [*HELLO, {"role": "assistant", "content": "FEWSHOT"},
                {"role": "user", "content": "next"}]  # fmt: skip
    client.chat.completions.create(messages=few_shot)
    first, second = client.interactions
    assert second.parent is None and not second.rewritten
    assert "FEWSHOT" in tokenizer.decode(engine.prompts[1])
    assert client.rewritten_turns_kept == 0
    rewritten = [*HELLO, {"role": "assistant", "content": "Thought: hi there"},
                 {"role": "user", "content": "Observation: 3"}]  # fmt: skip
    client.chat.completions.create(messages=rewritten)
    third = client.interactions[2]
    assert third.parent is first and third.rewritten and client.rewritten_turns_kept == 1
    assert third.input_ids[: len(first.tokens)] == first.tokens
    rows = client.export()
    assert sorted(r.rewritten_turns for r in rows) == [0, 1]


def test_one_parse_a_non_hermes_parser_drives_a_built_in_environment(tokenizer):
    """calculator with agent.tool_parser=llama3_json: the model's JSON call runs the tool
    (the environment reads the parse the runner made; re-parsing the text as Hermes found no
    call and scored the JSON as a wrong answer), then its answer earns the reward."""
    call = '{"name": "calculator", "arguments": {"expression": "2+3"}}'
    engine = ScriptedEngine(tokenizer, [call, "5"])
    runner = EpisodeRunner(
        engine,
        tokenizer,
        AgentConfig(env="calculator", tool_parser="llama3_json", max_turns=3),
        group_size=1,
        params=SamplingParams(max_new_tokens=64),
    )
    played = runner.generate([{"question": "what is 2 plus 3?", "answer": 5}], seed_index=0)
    (episode,) = played.episodes
    assert episode.tool_calls == 1 and episode.tool_errors == 0
    assert episode.messages[2] == {"role": "tool", "content": "5"}
    assert episode.reward == 1.0 and episode.success and episode.turns == 2


def test_one_rendering_per_turn(tokenizer):
    """A text conversation of four turns renders the chat template four times, through the
    client and through the episode runner (a turn renders its whole conversation once)."""
    client = RecordingClient(ScriptedEngine(tokenizer, ["1", "2", "3", "4"]), tokenizer)
    messages = list(HELLO)
    for _ in range(4):
        reply = client.chat.completions.create(messages=messages)
        messages += [reply.choices[0].message.model_dump(), {"role": "user", "content": "more"}]
    assert client.template.renders == 4
    assert [c.parent for c in client.interactions[1:]] == client.interactions[:-1]
    engine = ScriptedEngine(tokenizer, ["1", "2", "3"])
    runner = EpisodeRunner(
        engine,
        tokenizer,
        AgentConfig(env="guess_number", max_turns=3),
        group_size=1,
        params=SamplingParams(max_new_tokens=4),
    )
    played = runner.generate([{"target": 8}], seed_index=0)
    assert len(played.calls) == 3 and runner.template.renders == 3
    (row,) = runner.score(played).batch.input_ids  # still one row: each turn extends the last
    assert row.tolist()[: len(played.calls[2].input_ids)] == played.calls[2].input_ids


def test_n_choices_stream_over_http(tokenizer):
    """n = 2 with stream=True: each chunk names its choice; both choices are delivered and
    both recorded (calls recorded = choices delivered)."""
    client = RecordingClient(ScriptedEngine(tokenizer, ["a", "b", "c", "d"]), tokenizer,
                             max_tokens=4)  # fmt: skip
    with ChatServer(client) as server:
        api = openai.OpenAI(base_url=server.url, api_key="-", max_retries=0)
        stream = api.chat.completions.create(model="ardea", messages=HELLO, n=2, stream=True,
                                             stream_options={"include_usage": True})  # fmt: skip
        text, finished, usage = {0: "", 1: ""}, {}, None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                text[choice.index] += choice.delta.content or ""
                if choice.finish_reason:
                    finished[choice.index] = choice.finish_reason
        raw = httpx.post(f"{server.url}/chat/completions",
                         json={"messages": HELLO, "n": 2, "stream": True})  # fmt: skip
    assert text == {0: "a", 1: "b"} and finished == {0: "stop", 1: "stop"}
    assert usage.completion_tokens == 4  # "a" + <|im_end|>, "b" + <|im_end|>
    assert raw.status_code == 200
    events = [json.loads(e[6:]) for e in raw.text.split("\n\n") if e.startswith("data: {")]
    assert sorted(c["choices"][0]["index"] for c in events if c["choices"]) == [0, 0, 1, 1]
    assert len(client.interactions) == 4  # two requests, two choices each


ASK = "<|im_start|>user\nguess 1-8<|im_end|>\n<|im_start|>assistant\n"


def cut_where(tokenizer, ids, stop):
    """The tokens through the one completing ``stop`` (the shortest prefix whose text
    holds it; all of them when none does): a plain loop, independent of the engine."""
    for k in range(1, len(ids) + 1):
        if stop in tokenizer.decode(ids[:k], skip_special_tokens=False):
            return ids[:k]
    return ids


def stop_from(tokenizer, ids) -> str:
    """A stop string taken from a completion's own text (its 3rd and 4th tokens), so the
    test does not depend on what the model says on this machine."""
    assert len(ids) >= 10, f"the greedy completion ended early: {ids}"
    return tokenizer.decode(ids[2:4], skip_special_tokens=False)


def test_the_engine_ends_a_row_at_a_stop_string(engine, tokenizer):
    """Greedy on the tiny model, with a stop string from the first row's own text: each
    completion is the free one cut after the token completing it (found by a plain loop;
    a row whose text never holds it runs on), finish reason stop, the same log-probs; with
    min_new_tokens no row ends before it."""
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in (ASK, "17 + 25")]
    free = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=24))
    stop = stop_from(tokenizer, free[0].token_ids)
    cut = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=24, stop=[stop]))
    expected = [cut_where(tokenizer, c.token_ids, stop) for c in free]
    assert len(expected[0]) <= 4 < len(free[0].token_ids)  # the first row is cut short
    assert [c.token_ids for c in cut] == expected
    for c, f in zip(cut, free):
        assert c.finish_reason == (
            "stop" if len(c.token_ids) < len(f.token_ids) else f.finish_reason
        )
    # row 0 up to its stop: the same computation on the same inputs, so the same bits; row 1
    # also sees row 0 turn to padding, which a kernel may sum in another order: the float32
    # bound of test_workflows (K <= 128 terms, 2 layers: <= 3e-5), so 1e-4
    assert cut[0].logprobs == free[0].logprobs[: len(cut[0].logprobs)]
    assert cut[1].logprobs == pytest.approx(free[1].logprobs[: len(cut[1].logprobs)], abs=1e-4)
    late = SamplingParams(temperature=0, max_new_tokens=24, min_new_tokens=10, stop=[stop])
    assert len(engine.generate(prompts[:1], late)[0].token_ids) == 10


def test_a_stop_sequence_stops_the_engine_not_only_the_reply(engine, tokenizer):
    """Through the client on the real engine: a reply stopped by a stop sequence (from the
    free reply's own text) is generated only through the token completing it, not to the
    24 tokens asked, and its text ends before the stop sequence."""
    client = RecordingClient(engine, tokenizer, max_tokens=24, temperature=0)
    messages = [{"role": "user", "content": "guess 1-8"}]
    client.chat.completions.create(messages=messages)
    free = client.interactions[0].output_ids
    stop = stop_from(tokenizer, free)
    generated = []  # what the engine itself returned (the client cuts at the match anyway)
    real = engine.wait
    engine.wait = lambda handles: [generated.append(c.token_ids) or c for c in real(handles)]
    reply = client.chat.completions.create(messages=messages, stop=[stop])
    call = client.interactions[1]
    expected = cut_where(tokenizer, free, stop)
    assert generated == [expected] and len(expected) < len(free)
    assert reply.usage.completion_tokens == len(call.output_ids) == len(expected)
    assert call.output_ids == expected
    assert stop not in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
