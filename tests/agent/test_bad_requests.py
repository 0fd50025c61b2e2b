"""Bad input over HTTP: every request of the corpus is a 4xx with OpenAI's error body naming
the problem; the server keeps serving after each and loses nothing it recorded. Also: a
10 MB request does not delay a concurrent small one, and a reply whose client gave up and
retried is an orphan, left out of the export."""

from __future__ import annotations

import gzip
import json
import re
import socket
import threading
import time

import httpx
import openai
import pytest

from ardea.agent import RecordingClient
from ardea.agent.http_guard import ServerLimits
from ardea.agent.server import ChatServer
from ardea.errors import ArdeaError

from .agent_testing import ScriptedEngine

USER = [{"role": "user", "content": "hi"}]
CALLED = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
]  # fmt: skip
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
DEEP: dict = {}
for _ in range(70):  # a JSON schema nested 70 levels: past the 64 a request may have
    DEEP = {"type": "object", "properties": {"x": DEEP}}


def chat(**fields):
    return {"model": "ardea", "messages": USER, **fields}


# (what, route, body: a JSON value or raw bytes, status, param named or text in the message)
CORPUS = [
    ("malformed JSON", "chat/completions", b'{"messages": [', 400, "not valid JSON"),
    ("body not an object", "chat/completions", [1, 2], 400, "JSON object"),
    ("no messages", "chat/completions", {"model": "ardea"}, 400, "messages"),
    ("messages not a list", "chat/completions", chat(messages="hi"), 400, "messages"),
    ("messages empty", "chat/completions", chat(messages=[]), 400, "messages"),
    ("message not an object", "chat/completions", chat(messages=["hi"]), 400, "messages[0]"),
    ("unknown role", "chat/completions", chat(messages=[{"role": "wizard", "content": "x"}]),
     400, "messages[0].role"),
    ("message without role", "chat/completions", chat(messages=[{"content": "x"}]), 400,
     "messages[0].role"),
    ("content a number", "chat/completions", chat(messages=[{"role": "user", "content": 3}]),
     400, "messages[0].content"),
    ("image content part", "chat/completions", chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]), 400, "messages[0].content[0].type"),
    ("text part without text", "chat/completions", chat(messages=[{"role": "user", "content": [
        {"type": "text"}]}]), 400, "messages[0].content[0].text"),
    ("tool message without id", "chat/completions",
     chat(messages=[*CALLED, {"role": "tool", "content": "r"}]), 400, "messages[2].tool_call_id"),
    ("tool message answering no call", "chat/completions",
     chat(messages=[*USER, {"role": "tool", "tool_call_id": "x", "content": "r"}]), 400,
     "messages[1].tool_call_id"),
    ("tool call without a name", "chat/completions", chat(messages=[*USER, {
        "role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}]),
     400, "messages[1].tool_calls[0].function.name"),
    ("tools not a list", "chat/completions", chat(tools={"type": "function"}), 400, "tools"),
    ("tool without function", "chat/completions", chat(tools=[{"type": "function"}]), 400,
     "tools[0].function"),
    ("tool of another type", "chat/completions", chat(tools=[{"type": "retrieval"}]), 400,
     "tools[0].type"),
    ("tool without a name", "chat/completions", chat(tools=[{"type": "function",
     "function": {"parameters": {}}}]), 400, "tools[0].function.name"),
    ("tool parameters not an object", "chat/completions", chat(tools=[{"type": "function",
     "function": {"name": "f", "parameters": "x"}}]), 400, "tools[0].function.parameters"),
    ("max_tokens 0", "chat/completions", chat(max_tokens=0), 400, "max_tokens"),
    ("max_tokens not an int", "chat/completions", chat(max_tokens="5"), 400, "max_tokens"),
    ("max_completion_tokens negative", "chat/completions", chat(max_completion_tokens=-1), 400,
     "max_completion_tokens"),
    ("prompt beyond the context", "chat/completions", chat(max_tokens=100000), 400, "messages"),
    ("temperature negative", "chat/completions", chat(temperature=-1), 400, "temperature"),
    ("temperature a string", "chat/completions", chat(temperature="hot"), 400, "temperature"),
    ("top_p 0", "chat/completions", chat(top_p=0), 400, "top_p"),
    ("n 0", "chat/completions", chat(n=0), 400, "n"),
    ("n too many", "chat/completions", chat(n=1000), 400, "n"),
    ("stop not strings", "chat/completions", chat(stop=[1]), 400, "stop"),
    ("stop empty string", "chat/completions", chat(stop=[""]), 400, "stop"),
    ("metadata a string", "chat/completions", chat(metadata="x"), 400, "metadata"),
    ("metadata value a number", "chat/completions", chat(metadata={"k": 1}), 400, "metadata.k"),
    ("unknown parent id", "chat/completions", chat(metadata={"parent_id": "nope"}), 400,
     "metadata.parent_id"),
    ("tool_choice unknown", "chat/completions", chat(tools=[TOOL], tool_choice="sometimes"), 400,
     "tool_choice"),
    ("tool_choice without tools", "chat/completions", chat(tool_choice="required"), 400,
     "tool_choice"),
    ("tool_choice names no tool", "chat/completions", chat(tools=[TOOL], tool_choice={
        "type": "function", "function": {"name": "g"}}), 400, "tool_choice"),
    ("parallel_tool_calls a string", "chat/completions", chat(parallel_tool_calls="yes"), 400,
     "parallel_tool_calls"),
    ("stream a string", "chat/completions", chat(stream="yes"), 400, "stream"),
    ("stream_options without stream", "chat/completions",
     chat(stream_options={"include_usage": True}), 400, "stream_options"),
    ("logprobs a string", "chat/completions", chat(logprobs="x"), 400, "logprobs"),
    ("top_logprobs", "chat/completions", chat(top_logprobs=5), 400, "top_logprobs"),
    ("presence_penalty", "chat/completions", chat(presence_penalty=1.0), 400, "presence_penalty"),
    ("logit_bias", "chat/completions", chat(logit_bias={"1": 5}), 400, "logit_bias"),
    ("unknown option", "chat/completions", chat(foo=1), 400, "foo"),
    ("seed a float", "chat/completions", chat(seed=1.5), 400, "seed"),
    ("model a number", "chat/completions", chat(model=3), 400, "model"),
    ("rewritten history", "chat/completions", chat(messages=[
        *USER, {"role": "assistant", "content": "never said"}, *USER]), 400, "messages"),
    ("reward malformed JSON", "rewards", b"{", 400, "not valid JSON"),
    ("reward without id", "rewards", {"reward": 1.0}, 400, "completion_id"),
    ("reward for an unknown id", "rewards", {"completion_id": "x", "reward": 1.0}, 404,
     "completion_id"),
    ("reward NaN", "rewards", b'{"completion_id": "x", "reward": NaN}', 400, "reward"),
    ("reward infinite", "rewards", b'{"completion_id": "x", "reward": Infinity}', 400, "reward"),
    ("reward a string", "rewards", {"completion_id": "x", "reward": "high"}, 400, "reward"),
    ("responses without input", "responses", {"model": "ardea"}, 400, "input"),
    ("responses unknown item", "responses", {"input": [{"type": "reasoning"}]}, 400,
     "input[0].type"),
    ("responses web search tool", "responses", {"input": "hi", "tools": [
        {"type": "web_search"}]}, 400, "tools[0].type"),
    ("responses unknown previous id", "responses", {"input": "hi",
     "previous_response_id": "resp_x"}, 400, "previous_response_id"),
    ("responses max_output_tokens 0", "responses", {"input": "hi", "max_output_tokens": 0},
     400, "max_output_tokens"),
    ("responses function output without call", "responses", {"input": [
        {"type": "function_call_output", "call_id": "c", "output": "r"}]}, 400,
     "input[0].call_id"),
    ("unknown route", "completions", {"prompt": "hi"}, 404, "/v1/completions"),
    # depth and encodings: valid JSON a tokenizer or a repr cannot take
    ("100,000 levels deep", "chat/completions", b'{"messages": ' + b"[" * 100_000
     + b"]" * 100_000 + b"}", 400, "nested"),
    ("30,000 levels deep, Responses", "responses", b'{"input": ' + b"[" * 30_000
     + b"]" * 30_000 + b"}", 400, "nested"),
    ("just past the depth limit", "chat/completions", chat(tools=[{"type": "function",
     "function": {"name": "f", "parameters": DEEP}}]), 400, "nested"),
    ("tool arguments past the depth limit", "chat/completions", chat(messages=[*USER, {
        "role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
        "arguments": DEEP}}]}]), 400, "nested"),
    ("lone surrogate in content", "chat/completions",
     b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', 400, "messages[0].content"),
    ("lone surrogate in a key", "chat/completions",
     b'{"messages": [{"role": "user", "content": "x"}], "metadata": {"\\udfff": "v"}}', 400,
     "surrogate"),
    ("lone surrogate in stop", "chat/completions",
     b'{"messages": [{"role": "user", "content": "x"}], "stop": ["\\ud83d"]}', 400, "stop[0]"),
    ("lone surrogate, Responses input", "responses", b'{"input": "\\udc00"}', 400, "input"),
    ("lone surrogate, Responses instructions", "responses",
     b'{"input": "hi", "instructions": "\\ud800"}', 400, "instructions"),
    ("lone surrogate in a reward id", "rewards", b'{"completion_id": "\\ud800", "reward": 1}',
     400, "completion_id"),
    ("bytes not UTF-8", "chat/completions", b"\xff\xfe{}", 400, "not valid JSON"),
    ("empty body", "chat/completions", b"", 400, "not valid JSON"),
    ("body null", "chat/completions", b"null", 400, "JSON object"),
    ("body a string", "chat/completions", b'"hi"', 400, "JSON object"),
    ("an integer of 5,000 digits", "chat/completions",
     b'{"messages": [{"role": "user", "content": "x"}], "seed": ' + b"9" * 5000 + b"}", 400,
     "not valid JSON"),
    # numeric extremes and types of the chat options
    ("seed 2**64", "chat/completions", chat(seed=2**64), 400, "seed"),
    ("seed negative", "chat/completions", chat(seed=-1), 400, "seed"),
    ("seed true", "chat/completions", chat(seed=True), 400, "seed"),
    ("max_tokens 2**64", "chat/completions", chat(max_tokens=2**64), 400, "max_tokens"),
    ("max_tokens a float", "chat/completions", chat(max_tokens=4.0), 400, "max_tokens"),
    ("n 2**64", "chat/completions", chat(n=2**64), 400, "n"),
    ("n a string", "chat/completions", chat(n="2"), 400, "n"),
    ("n true", "chat/completions", chat(n=True), 400, "n"),
    ("max_completion_tokens 0", "chat/completions", chat(max_completion_tokens=0), 400,
     "max_completion_tokens"),
    ("temperature 1e309", "chat/completions",
     b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1e309}', 400,
     "temperature"),
    ("temperature NaN", "chat/completions",
     b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, "temperature"),
    ("temperature true", "chat/completions", chat(temperature=True), 400, "temperature"),
    ("top_p above 1", "chat/completions", chat(top_p=1.0000001), 400, "top_p"),
    ("top_p a string", "chat/completions", chat(top_p="1"), 400, "top_p"),
    ("logprobs 1", "chat/completions", chat(logprobs=1), 400, "logprobs"),
    ("frequency_penalty", "chat/completions", chat(frequency_penalty=0.5), 400,
     "frequency_penalty"),
    ("user a number", "chat/completions", chat(user=5), 400, "user"),
    ("stop a number", "chat/completions", chat(stop=5), 400, "stop"),
    ("seventeen stop sequences", "chat/completions", chat(stop=["x"] * 17), 400, "stop"),
    ("stream_options a string", "chat/completions", chat(stream=True, stream_options="x"),
     400, "stream_options"),
    ("stream_options unknown key", "chat/completions",
     chat(stream=True, stream_options={"chunks": 3}), 400, "stream_options"),
    ("content part not an object", "chat/completions",
     chat(messages=[{"role": "user", "content": ["hi"]}]), 400, "messages[0].content[0].type"),
    ("role a number", "chat/completions", chat(messages=[{"role": 1, "content": "x"}]), 400,
     "messages[0].role"),
    ("tool_calls not a list", "chat/completions", chat(messages=[*USER, {"role": "assistant",
     "tool_calls": {"id": "c"}}]), 400, "messages[1].tool_calls"),
    ("tool call arguments a number", "chat/completions", chat(messages=[*USER, {
        "role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
        "arguments": 5}}]}]), 400, "messages[1].tool_calls[0].function.arguments"),
    ("tool a string", "chat/completions", chat(tools=["f"]), 400, "tools[0].type"),
    ("tool_choice without a function", "chat/completions",
     chat(tools=[TOOL], tool_choice={"type": "function"}), 400, "tool_choice"),
    # every field of the Responses API, named as that API names it
    ("responses text a string", "responses", {"input": "hi", "text": "plain"}, 400, "text"),
    ("responses text.format a string", "responses", {"input": "hi", "text": {"format": "json"}},
     400, "text.format"),
    ("responses json schema output", "responses", {"input": "hi", "text": {"format": {
        "type": "json_schema"}}}, 400, "text.format"),
    ("responses text verbosity", "responses", {"input": "hi", "text": {"verbosity": "high"}},
     400, "text.verbosity"),
    ("responses text unknown key", "responses", {"input": "hi", "text": {"style": 1}}, 400,
     "text.style"),
    ("responses reasoning a string", "responses", {"input": "hi", "reasoning": "high"}, 400,
     "reasoning"),
    ("responses reasoning effort", "responses", {"input": "hi", "reasoning": {
        "effort": "high"}}, 400, "reasoning.effort"),
    ("responses reasoning unknown key", "responses", {"input": "hi", "reasoning": {
        "depth": 3}}, 400, "reasoning.depth"),
    ("responses stream a string", "responses", {"input": "hi", "stream": "yes"}, 400,
     "stream"),
    ("responses store a string", "responses", {"input": "hi", "store": "no"}, 400, "store"),
    ("responses background", "responses", {"input": "hi", "background": True}, 400,
     "background"),
    ("responses background a string", "responses", {"input": "hi", "background": "no"}, 400,
     "background"),
    ("responses instructions a number", "responses", {"input": "hi", "instructions": 5}, 400,
     "instructions"),
    ("responses input a number", "responses", {"input": 5}, 400, "input"),
    ("responses input null", "responses", {"input": None}, 400, "input"),
    ("responses input item a number", "responses", {"input": [5]}, 400, "input[0]"),
    ("responses tool role", "responses", {"input": [{"role": "tool", "content": "x"}]}, 400,
     "input[0].role"),
    ("responses message without role", "responses", {"input": [{"content": "x"}]}, 400,
     "input[0].role"),
    ("responses content a number", "responses", {"input": [{"role": "user", "content": 5}]},
     400, "input[0].content"),
    ("responses image part", "responses", {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "x"}]}]}, 400, "input[0].content[0].type"),
    ("responses function_call without call_id", "responses", {"input": [
        {"type": "function_call", "name": "f", "arguments": "{}"}]}, 400, "input[0].call_id"),
    ("responses function_call arguments an object", "responses", {"input": [
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}, 400,
     "input[0].arguments"),
    ("responses function_call with an empty name", "responses", {"input": [*USER, {
        "type": "function_call", "call_id": "c", "name": "", "arguments": "{}"}]}, 400,
     "input[1].name"),
    ("responses output without call_id", "responses", {"input": [
        {"type": "function_call_output", "output": "r"}]}, 400, "input[0].call_id"),
    ("responses max_output_tokens a string", "responses", {"input": "hi",
     "max_output_tokens": "5"}, 400, "max_output_tokens"),
    ("responses max_output_tokens 2**64", "responses", {"input": "hi",
     "max_output_tokens": 2**64}, 400, "max_output_tokens"),
    ("responses beyond the context", "responses", {"input": "hi",
     "max_output_tokens": 100_000}, 400, "input"),
    ("responses temperature 5", "responses", {"input": "hi", "temperature": 5}, 400,
     "temperature"),
    ("responses temperature a string", "responses", {"input": "hi", "temperature": "hot"}, 400,
     "temperature"),
    ("responses top_p 0", "responses", {"input": "hi", "top_p": 0}, 400, "top_p"),
    ("responses tools not a list", "responses", {"input": "hi", "tools": {"type": "function"}},
     400, "tools"),
    ("responses tool without a name", "responses", {"input": "hi", "tools": [
        {"type": "function", "parameters": {}}]}, 400, "tools[0].name"),
    ("responses tool parameters a string", "responses", {"input": "hi", "tools": [
        {"type": "function", "name": "f", "parameters": "x"}]}, 400, "tools[0].parameters"),
    ("responses tool_choice a number", "responses", {"input": "hi", "tool_choice": 5}, 400,
     "tool_choice"),
    ("responses tool_choice names no tool", "responses", {"input": "hi", "tools": [
        {"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
     400, "tool_choice"),
    ("responses metadata a string", "responses", {"input": "hi", "metadata": "x"}, 400,
     "metadata"),
    ("responses metadata value a number", "responses", {"input": "hi", "metadata": {"k": 1}},
     400, "metadata.k"),
    ("responses unknown parent id", "responses", {"input": "hi", "metadata": {
        "parent_id": "nope"}}, 400, "metadata.parent_id"),
    ("responses previous id a number", "responses", {"input": "hi",
     "previous_response_id": 5}, 400, "previous_response_id"),
    ("responses include a string", "responses", {"input": "hi", "include": "x"}, 400,
     "include"),
    ("responses include unknown", "responses", {"input": "hi", "include": [
        "file_search_call.results"]}, 400, "include[0]"),
    ("responses truncation auto", "responses", {"input": "hi", "truncation": "auto"}, 400,
     "truncation"),
    ("responses top_logprobs", "responses", {"input": "hi", "top_logprobs": 3}, 400,
     "top_logprobs"),
    ("responses parallel_tool_calls a string", "responses", {"input": "hi",
     "parallel_tool_calls": "yes"}, 400, "parallel_tool_calls"),
    ("responses user a number", "responses", {"input": "hi", "user": 5}, 400, "user"),
    ("responses model a number", "responses", {"input": "hi", "model": 5}, 400, "model"),
    ("responses unknown option", "responses", {"input": "hi", "n": 2}, 400, "n"),
    ("responses body a list", "responses", [1], 400, "JSON object"),
    # rewards
    ("reward id a number", "rewards", {"completion_id": 5, "reward": 1}, 400, "completion_id"),
    ("reward choice a string", "rewards", {"completion_id": "x", "reward": 1, "choice": "0"},
     400, "choice"),
    ("reward body a list", "rewards", [1], 400, "JSON object"),
    ("reward 10,000 levels deep", "rewards", b'{"completion_id": ' + b"[" * 10_000
     + b"]" * 10_000 + b"}", 400, "nested"),
    # headers: what only ardea's workflow runner sends
    ("episode header without workflows", "chat/completions", chat(), 400, "x-ardea-episode",
     {"x-ardea-episode": "1"}),
    ("episode header not a number", "chat/completions", chat(), 400, "x-ardea-episode",
     {"x-ardea-episode": "one"}),
    ("episode header, Responses", "responses", {"input": "hi"}, 400, "x-ardea-episode",
     {"x-ardea-episode": "0"}),
    # the shared HTTP layer: what a web page could send, and bodies that inflate
    ("a text/plain post (a page's simple request)", "chat/completions", chat(), 415,
     "takes Content-Type", {"content-type": "text/plain"}),
    ("a form post", "chat/completions", b"a=1", 415, "takes Content-Type",
     {"content-type": "application/x-www-form-urlencoded"}),
    ("a web page's Origin", "chat/completions", chat(), 403, "web page origin",
     {"origin": "http://evil.example"}),
    ("another local port's Origin", "chat/completions", chat(), 403, "web page origin",
     {"origin": "http://127.0.0.1:1"}),
    ("a rebinding page's Host", "chat/completions", chat(), 403, "is not this server's",
     {"host": "evil.example:8000"}),
    ("a cross-site fetch", "chat/completions", chat(), 403, "cross-site request",
     {"sec-fetch-site": "cross-site"}),
    ("a brotli body", "chat/completions", chat(), 415, "is not served (gzip",
     {"content-encoding": "br"}),
    ("a body that is not gzip", "chat/completions", b"not gzip", 400, "does not decompress",
     {"content-encoding": "gzip"}),
    ("16 KB of gzip inflating to 16 MiB", "chat/completions", gzip.compress(b" " * 2**24), 413,
     "decompresses past", {"content-encoding": "gzip"}),
]  # fmt: skip


class Limited(ScriptedEngine):
    """A scripted engine with the tiny model's context (512 positions)."""

    @property
    def max_context(self) -> int:
        return 512


@pytest.fixture(scope="module")
def server(tokenizer):
    engine = Limited(tokenizer, ["ok"] * 1000)
    client = RecordingClient(engine, tokenizer, max_tokens=4)
    with ChatServer(client) as s:
        yield client, s


DELIVERED = {"choices": 0}  # the choices the corpus's good requests were answered with


def _case(case):
    what, route, body, status, names, *headers = case
    return what, route, body, status, names, headers[0] if headers else {}


@pytest.mark.parametrize("what,route,body,status,names,headers", [_case(c) for c in CORPUS],
                         ids=[c[0] for c in CORPUS])  # fmt: skip
def test_bad_request_is_a_4xx_naming_the_problem(server, what, route, body, status, names,
                                                 headers):  # fmt: skip
    """A 4xx with OpenAI's error body; ``names``: the field named (``param`` exactly), or,
    for a problem of the body as a whole, a phrase of the message. Nothing is recorded."""
    client, s = server
    before = list(client.interactions)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = httpx.post(f"{s.url}/{route}", content=content,
                       headers={"content-type": "application/json", **headers})  # fmt: skip
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if " " in names or names in ("nested", "surrogate") or route == "completions":
        assert names in error["message"], error
    else:
        assert error["param"] == names, error
    assert len(error["message"]) < 600, "a value quoted in full"
    assert client.interactions == before, "a refused request recorded a call"
    # still serving, nothing recorded lost
    ok = httpx.post(f"{s.url}/chat/completions", json=chat())
    assert ok.status_code == 200 and client.interactions[: len(before)] == before
    assert len(client.interactions) == len(before) + 1
    DELIVERED["choices"] += len(ok.json()["choices"])


def test_corpus_size():
    assert len(CORPUS) > 100


def test_calls_recorded_equal_choices_delivered_after_the_corpus(server):
    """Runs after the corpus (the module's tests run in order on one worker): every call
    the server recorded is a choice it delivered."""
    client, _ = server
    assert DELIVERED["choices"] == len(CORPUS)
    assert len(client.interactions) == DELIVERED["choices"]


HEAD = (
    "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    "Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
)


def small_one_answered(url: str) -> bool:
    """A small chat request is answered (a server that stalls it fails the test at 30 s)."""
    return httpx.post(f"{url}/chat/completions", json=chat(), timeout=30).status_code == 200


def reply_on(sock: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the HTTP reply read from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed without a reply: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed mid-reply: {head!r}"
        body += chunk
    return int(head.split()[1]), json.loads(body)


def test_a_ten_megabyte_request_does_not_stall_a_small_one(tokenizer):
    """A small request is answered while a 10 MB one is in progress: its body on the way
    (all but 64 KB unsent), and with its body read, held at the check of its characters in
    its own worker thread. At the size limit the big one is refused from its Content-Length
    (413) with its body still unsent; with the limit raised, by its characters (400), before
    it is tokenised."""
    engine = Limited(tokenizer, ["ok"] * 10)
    client = RecordingClient(engine, tokenizer, max_tokens=4)
    huge = json.dumps(chat(messages=[{"role": "user", "content": "x" * 10_000_000}])).encode()
    head, first = HEAD.format(length=len(huge)).encode(), 2**16

    with ChatServer(client, limits=ServerLimits(max_body_bytes=8 * 2**20)) as s:
        with socket.create_connection((s.host, s.port), timeout=60) as big:
            big.sendall(head + huge[:first])
            assert small_one_answered(s.url)
            status, body = reply_on(big)  # the rest of its body never sent
    assert status == 413 and body["error"]["code"] == "request_too_large", body

    held, release = threading.Event(), threading.Event()
    check = client._check_characters

    def held_check(request):  # the big request waits here, in its worker thread
        if len(request.messages[0]["content"]) > first:
            held.set()
            release.wait(120)  # longer than a small request waits: that one fails first
            held.clear()
        check(request)

    client._check_characters = held_check
    with ChatServer(client, limits=ServerLimits(max_body_bytes=64 * 2**20)) as s:
        try:
            with socket.create_connection((s.host, s.port), timeout=60) as big:
                big.sendall(head + huge[:first])
                assert small_one_answered(s.url)  # the big one's body on the way
                big.sendall(huge[first:])
                assert held.wait(60), "the 10 MB request never reached its check"
                assert small_one_answered(s.url) and held.is_set()  # answered meanwhile
                release.set()
                status, body = reply_on(big)
        finally:
            release.set()
    assert status == 400 and "characters" in body["error"]["message"], body
    assert len(client.interactions) == 3  # the small ones only


class HeldFirst(ScriptedEngine):
    """Holds its first call until ``release`` is set (``entered``: that call has begun)."""

    def __init__(self, tokenizer, replies):
        super().__init__(tokenizer, replies)
        self.entered, self.release = threading.Event(), threading.Event()

    def generate(self, prompts, params):
        if self.calls == 0:
            self.entered.set()
            assert self.release.wait(120), "the test never released the first call"
        return super().generate(prompts, params)


def test_a_retried_call_leaves_an_orphan_out_of_the_export(tokenizer):
    """The openai client times out on the first call (held in the engine) and retries; the
    first reply, released only once the server has seen that client go, is never delivered:
    marked an orphan, not exported, counted."""
    engine = HeldFirst(tokenizer, ["one", "two"])
    client = RecordingClient(engine, tokenizer, max_tokens=4)
    with ChatServer(client) as s:
        open_connections = s._server.server_state.connections  # uvicorn's own set
        attempts = []

        def on_send(request: httpx.Request) -> None:
            attempts.append(request)
            if len(attempts) == 2:  # the retry: the client gave the first attempt up
                request.extensions["timeout"] = httpx.Timeout(60).as_dict()
                if not engine.entered.wait(60):
                    pytest.fail("the first attempt never reached the engine")
                deadline = time.monotonic() + 60  # until the server saw its connection close
                while open_connections and time.monotonic() < deadline:
                    time.sleep(0.01)
                if open_connections:
                    pytest.fail("the server never saw the first attempt's connection close")
                engine.release.set()

        with httpx.Client(event_hooks={"request": [on_send]}) as http:
            api = openai.OpenAI(base_url=s.url, api_key="-", http_client=http, max_retries=1,
                                timeout=httpx.Timeout(60, read=0.5))  # fmt: skip
            try:
                reply = api.chat.completions.create(model="ardea", messages=USER)
            finally:
                engine.release.set()
        deadline = time.monotonic() + 60
        while client.orphans < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(attempts) == 2 and reply.choices[0].message.content == "two"
    orphan, delivered = client.interactions
    assert orphan.orphan and not delivered.orphan
    assert client.orphans == 1
    (row,) = client.export()
    assert list(row.segments[-1].token_ids) == delivered.output_ids


def test_a_server_with_a_key_serves_only_the_key(tokenizer):
    """``--api-key``: the OpenAI SDK's Bearer key is served; a wrong or missing key is a
    401; a CORS preflight is refused (no CORS header ever); beyond loopback a key is
    required to start at all."""
    client = RecordingClient(Limited(tokenizer, ["ok"] * 4), tokenizer, max_tokens=4)
    with ChatServer(client, limits=ServerLimits(api_key="sk-local")) as s:
        api = openai.OpenAI(base_url=s.url, api_key="sk-local", max_retries=0)
        assert api.chat.completions.create(model="ardea", messages=USER).choices
        with pytest.raises(openai.AuthenticationError, match="wrong API key"):
            openai.OpenAI(base_url=s.url, api_key="sk-other", max_retries=0).models.list()
        assert httpx.get(f"{s.url}/models").status_code == 401
        keyed = httpx.get(f"{s.url}/models", headers={"x-api-key": "sk-local"})
        assert keyed.status_code == 200
        preflight = httpx.options(f"{s.url}/chat/completions", headers={
            "origin": "http://evil.example", "access-control-request-method": "POST"})  # fmt: skip
        assert preflight.status_code == 403
        assert not any(h.startswith("access-control") for h in preflight.headers)
    assert len(client.interactions) == 1
    with pytest.raises(ArdeaError, match="give it an API key"):
        ChatServer(client, host="0.0.0.0")


def test_requests_past_the_in_flight_limit_are_told_to_retry(tokenizer):
    """With ``max_in_flight=1`` a second request while the first is held is a 429 with
    Retry-After; once the first is done the next one is served."""
    engine = HeldFirst(tokenizer, ["one", "two"])
    client = RecordingClient(engine, tokenizer, max_tokens=4)
    with ChatServer(client, limits=ServerLimits(max_in_flight=1)) as s:
        first = threading.Thread(target=httpx.post, args=(f"{s.url}/chat/completions",),
                                 kwargs={"json": chat(), "timeout": 60})  # fmt: skip
        first.start()
        try:
            assert engine.entered.wait(60)
            busy = httpx.post(f"{s.url}/chat/completions", json=chat())
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
            assert "max_in_flight=1" in busy.json()["error"]["message"]
        finally:
            engine.release.set()
            first.join(60)
        assert httpx.post(f"{s.url}/chat/completions", json=chat()).status_code == 200
