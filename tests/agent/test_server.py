"""The recording client over HTTP, called with the real ``openai`` client on loopback."""

from __future__ import annotations

import threading

import openai
import pytest
import torch

from ardea.agent import RecordingClient
from ardea.agent.server import ChatServer
from ardea.data import TrajectoryBatch

from .agent_testing import recomputed_logprobs


@pytest.fixture
def served(engine, tokenizer):
    client = RecordingClient(engine, tokenizer, max_tokens=5)
    with ChatServer(client) as server:
        yield client, openai.OpenAI(base_url=server.url, api_key="-", max_retries=0)


def test_http_conversation_is_recorded_with_exact_logprobs(served, model, tokenizer):
    client, api = served
    messages = [{"role": "user", "content": "guess 1-8"}]
    first = api.chat.completions.create(model="any", messages=messages, seed=1, logprobs=True)
    assert isinstance(first, openai.types.chat.ChatCompletion)
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "user", "content": "lower"}]
    second = api.chat.completions.create(model="any", messages=messages, seed=2)
    client.set_reward(second.id, 1.0)
    (row,) = client.export()
    b = TrajectoryBatch.from_trajectories([row], pad_token_id=0)
    parent, child = client.interactions
    assert child.parent is parent and b.rewards.tolist() == [1.0]
    assert [x.logprob for x in first.choices[0].logprobs.content] == parent.logprobs
    generated = b.input_ids[0][b.loss_mask[0]].tolist()
    assert generated == parent.output_ids + child.output_ids
    reference = recomputed_logprobs(model, b.input_ids)
    torch.testing.assert_close(b.logprobs[b.loss_mask], reference[b.loss_mask], atol=1e-5, rtol=0)


def test_concurrent_http_calls_are_each_served_and_recorded(served):
    client, api = served
    done = []

    def call(i):
        msg = [{"role": "user", "content": f"guess 1-{i + 2}"}]
        done.append(api.chat.completions.create(model="ardea", messages=msg))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == 4 and len(client.interactions) == 4
    assert {r.id for r in done} == {c.id for c in client.interactions}


def test_bad_requests_are_400s_naming_the_problem(served):
    _, api = served
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        api.chat.completions.create(
            model="ardea", messages=[{"role": "user", "content": "x"}], presence_penalty=1.0
        )


def test_streamed_http_calls_parse_with_the_openai_client(served, tokenizer):
    """stream=True over HTTP: the openai client parses the server-sent events; the text and
    log-probs it assembles are the recorded call's, and the continuation of a streamed reply
    is appended to its tokens like any other."""
    client, api = served
    messages = [{"role": "user", "content": "guess 1-8"}]
    stream = api.chat.completions.create(
        model="any", messages=messages, stream=True, stream_options={"include_usage": True},
        logprobs=True, seed=5,
    )  # fmt: skip
    chunks = list(stream)
    (first,) = client.interactions
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == first.reply.content
    logprobs = [t.logprob for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]  # fmt: skip
    assert logprobs == first.logprobs
    assert chunks[-1].usage.total_tokens == len(first.input_ids) + len(first.output_ids)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "lower"}]
    api.chat.completions.create(model="any", messages=messages, stream=True)
    second = client.interactions[1]
    assert second.parent is first
    assert second.input_ids[: len(first.input_ids) + len(first.output_ids)] == (
        first.input_ids + first.output_ids
    )


def test_responses_api_with_previous_response_id(tokenizer):
    """POST /v1/responses through the openai client: the reply's text as the output message,
    a second response continuing the first by previous_response_id (one row), a reward
    attached by response id."""
    import httpx

    from .agent_testing import ScriptedEngine

    engine = ScriptedEngine(tokenizer, ["4", "6"])
    client = RecordingClient(engine, tokenizer)
    with ChatServer(client) as server:
        api = openai.OpenAI(base_url=server.url, api_key="-", max_retries=0)
        first = api.responses.create(model="ardea", input="guess 1-8", instructions="play")
        second = api.responses.create(
            model="ardea", input=[{"role": "user", "content": "higher"}],
            previous_response_id=first.id, instructions="play",
        )  # fmt: skip
        ok = httpx.post(f"{server.url}/rewards", json={"completion_id": second.id, "reward": 1})
    assert (first.output_text, second.output_text, ok.status_code) == ("4", "6", 200)
    assert first.status == "completed" and first.usage.output_tokens == 2
    parent, child = client.interactions
    assert child.parent is parent and child.reward == 1.0
    assert tokenizer.decode(engine.prompts[0]).startswith("<|im_start|>system\nplay<|im_end|>")
    (row,) = client.export()
    assert row.reward == 1.0
