"""``llm_judge`` over real HTTP: the real ``openai`` client of the reward function talks to
ardea's OpenAI-compatible server (the one ``ardea serve`` runs), whose engine replies with
scripted grades, so each parsed score is known. A server that accepts connections and never
answers (a stub: the one fault a real server cannot be made to show on demand) gives the
timeout path."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ardea.agent import RecordingClient
from ardea.agent.server import ChatServer
from ardea.errors import ConfigError
from ardea.reward import RewardScorer, make_reward

from .agent_testing import ScriptedEngine

TEMPLATE = "Q: {prompt} Reference: {answer} A: {completion} Grade:"


def judged(tokenizer, replies, **kwargs):
    """The judge's scores of three completions, and what the server saw."""
    engine = ScriptedEngine(tokenizer, replies)
    with ChatServer(RecordingClient(engine, tokenizer, max_tokens=16)) as server:
        judge = make_reward(
            "llm_judge", base_url=server.url, model="judge", template=TEMPLATE, **kwargs
        )
        scores = judge(["1+1=", "2+2=", "3+3="], ["2", "5", "6"], [{"answer": a} for a in "246"])
    return scores, engine


def test_grades_are_parsed_scaled_and_missing_ones_are_none(tokenizer):
    scores, engine = judged(
        tokenizer, ["10", "Grade: 3.5 out of 10", "no idea"], scale=10.0, concurrency=1
    )
    assert list(scores) == [1.0, 0.35, None]
    sent = [tokenizer.decode(p) for p in engine.prompts]
    assert "Q: 2+2= Reference: 4 A: 5 Grade:" in sent[1]  # the template, filled per row
    assert scores.metrics["requests"] == 3
    assert scores.metrics["prompt_tokens"] == sum(len(p) for p in engine.prompts)
    assert scores.metrics["completion_tokens"] == sum(len(o) for o in engine.outputs)


def test_concurrent_requests_each_get_their_grade(tokenizer):
    scores, engine = judged(tokenizer, ["7"] * 3, concurrency=3)
    assert list(scores) == [7.0, 7.0, 7.0] and len(engine.prompts) == 3


def test_a_failed_grade_is_masked_and_counted_by_the_scorer(tokenizer):
    engine = ScriptedEngine(tokenizer, ["8", "garbled"])
    with ChatServer(RecordingClient(engine, tokenizer, max_tokens=16)) as server:
        judge = make_reward("llm_judge", base_url=server.url, model="judge", concurrency=1)
        scorer = RewardScorer([(judge, 1.0)], timeout_s=30.0, on_error="mask")
        result = scorer.score(["a", "b"], ["x", "y"], [{}, {}])
    assert result.rewards[0] == 8.0 and result.failed == [False, True]
    assert result.failed_by_function == {"llm_judge": 1}
    assert result.metrics["reward/llm_judge/requests"] == 2


def test_a_server_that_never_answers_times_out_into_failed_scores():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    held = []
    stop = threading.Event()

    def accept():  # take connections, read nothing, answer nothing
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        judge = make_reward(
            "llm_judge", base_url=f"http://127.0.0.1:{port}/v1", model="judge",
            timeout_s=0.5, retries=1, concurrency=2,
        )  # fmt: skip
        started = time.monotonic()
        scores = judge(["q"] * 2, ["a"] * 2, [{}, {}])
        took = time.monotonic() - started
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()
    assert list(scores) == [None, None]
    assert scores.metrics["prompt_tokens"] == 0
    # two tries of 0.5 s each, side by side, plus the client's backoff (< 1 s): not minutes
    assert 1.0 <= took < 4.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_url": "localhost:8000"}, "base_url='localhost:8000' must be an http"),
        ({"template": "grade {prompt}"}, "has no {completion}"),
        ({"pattern": "("}, "pattern='\\(' is not a regex"),
        ({"concurrency": 0}, "concurrency=0 must be an integer >= 1"),
        ({"scale": 0}, "scale=0 must be a number > 0"),
    ],
)
def test_bad_options_are_named(kwargs, match):
    options = {"base_url": "http://127.0.0.1:1/v1", "model": "judge", **kwargs}
    with pytest.raises(ConfigError, match=match):
        make_reward("llm_judge", **options)


def test_a_template_field_the_record_lacks_is_named(tokenizer):
    with pytest.raises(ConfigError, match=r"\{answer\} is not a column of the prompt record"):
        judged_rows = make_reward(
            "llm_judge", base_url="http://127.0.0.1:1/v1", model="judge", template=TEMPLATE
        )
        judged_rows(["q"], ["a"], [{"question": "q"}])
