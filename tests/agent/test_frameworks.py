"""Agent frameworks, unchanged, against ardea's server.

Each test runs a 2-turn tool-calling agent written with a real framework (the ``openai``
client sync and async, the OpenAI Agents SDK with its chat-completions model and with its
default Responses model, LangChain, LiteLLM, pydantic-ai, smolagents) against a
``ChatServer`` whose engine is scripted: turn 1 calls ``weather(city="Paris")``, turn 2
answers. Each checks that the framework's requests were accepted and the reply parsed (the
tool ran with the scripted arguments, the final answer came back), that both calls were
recorded with their token ids and log-probs, that the conversation exported as one row, and
that exactly the generated tokens are trained.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from ardea.agent import RecordingClient
from ardea.agent.server import ChatServer
from ardea.data import TrajectoryBatch

from .agent_testing import ScriptedEngine

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

CALL = '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'
ANSWER = "It is sunny."
FINAL = '<tool_call>{"name": "final_answer", "arguments": {"answer": "It is sunny."}}</tool_call>'
QUESTION = "What is the weather in Paris?"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


class Served:
    """A server over a scripted engine, and what the agent's tool was called with."""

    def __init__(self, tokenizer, replies, history="error"):
        self.engine = ScriptedEngine(tokenizer, replies)
        self.client = RecordingClient(self.engine, tokenizer, history=history)
        self.server = ChatServer(self.client).start()
        self.url = self.server.url
        self.tool_calls: list[str] = []

    def weather(self, city: str) -> str:
        """The weather in a city."""
        self.tool_calls.append(city)
        return "sunny"

    def check(self, answer) -> None:
        """The checks of the module docstring."""
        assert self.tool_calls == ["Paris"] and ANSWER in str(answer)
        calls = self.client.interactions
        assert len(calls) == 2 == self.engine.calls
        assert [c.output_ids for c in calls] == self.engine.outputs
        assert [c.logprobs for c in calls] == [[-0.5] * len(o) for o in self.engine.outputs]
        assert calls[1].parent is calls[0]
        (row,) = self.client.export()
        b = TrajectoryBatch.from_trajectories([row], pad_token_id=0)
        trained = b.input_ids[0][b.loss_mask[0]].tolist()
        assert trained == self.engine.outputs[0] + self.engine.outputs[1]
        assert b.turn_ids[0][b.loss_mask[0]].unique().tolist() == [0, 1]


@pytest.fixture
def served(tokenizer):
    made = []

    def serve(replies=(CALL, ANSWER), history="error"):
        made.append(Served(tokenizer, replies, history))
        return made[-1]

    yield serve
    for s in made:
        s.server.stop()


def test_openai_sync_client(served):
    import openai

    s = served()
    api = openai.OpenAI(base_url=s.url, api_key="-", max_retries=0)
    messages = [{"role": "user", "content": QUESTION}]
    first = api.chat.completions.create(model="ardea", messages=messages, tools=[WEATHER_TOOL])
    (call,) = first.choices[0].message.tool_calls
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    result = s.weather(**json.loads(call.function.arguments))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    second = api.chat.completions.create(model="ardea", messages=messages, tools=[WEATHER_TOOL])
    s.check(second.choices[0].message.content)


def test_openai_async_client_streaming(served):
    import openai

    s = served()

    async def agent() -> str:
        api = openai.AsyncOpenAI(base_url=s.url, api_key="-", max_retries=0)
        messages = [{"role": "user", "content": QUESTION}]
        calls, text = {}, ""
        for _ in range(2):
            stream = await api.chat.completions.create(
                model="ardea", messages=messages, tools=[WEATHER_TOOL], stream=True
            )
            calls, text = {}, ""
            async for chunk in stream:
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    for c in choice.delta.tool_calls or []:
                        calls[c.index] = c
            if not calls:
                return text
            tool_calls = [{"id": c.id, "type": "function", "function": c.function.model_dump()}
                          for c in calls.values()]  # fmt: skip
            messages.append({"role": "assistant", "content": text, "tool_calls": tool_calls})
            for c in calls.values():
                result = s.weather(**json.loads(c.function.arguments))
                messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
        return text

    s.check(asyncio.run(agent()))


@pytest.mark.parametrize("model", ["chat_completions", "responses"])
def test_openai_agents_sdk(served, model):
    """The Agents SDK with its chat-completions model, and with its default model, which
    calls POST /v1/responses (run streamed: the Responses API's events)."""
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    s = served()
    api = AsyncOpenAI(base_url=s.url, api_key="-", max_retries=0)
    kind = OpenAIChatCompletionsModel if model == "chat_completions" else OpenAIResponsesModel
    agent = Agent(
        name="weather", instructions="Answer with the tool.", tools=[function_tool(s.weather)],
        model=kind(model="ardea", openai_client=api),
    )  # fmt: skip

    async def run():
        if model == "chat_completions":
            return (await Runner.run(agent, QUESTION)).final_output
        streamed = Runner.run_streamed(agent, QUESTION)
        async for _ in streamed.stream_events():
            pass
        return streamed.final_output

    s.check(asyncio.run(run()))


def test_langchain_bind_tools(served):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    s = served()
    weather = tool(s.weather)
    llm = ChatOpenAI(model="ardea", base_url=s.url, api_key="-", max_retries=0)
    llm = llm.bind_tools([weather])
    messages = [HumanMessage(QUESTION)]
    reply = llm.invoke(messages)
    messages.append(reply)
    for call in reply.tool_calls:
        messages.append(ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"]))
    s.check(llm.invoke(messages).content)


def test_litellm(served):
    import litellm

    s = served()
    options = {"model": "openai/ardea", "api_base": s.url, "api_key": "-", "tools": [WEATHER_TOOL]}
    messages = [{"role": "user", "content": QUESTION}]
    message = litellm.completion(messages=messages, **options).choices[0].message
    messages.append(message.model_dump())
    for call in message.tool_calls:
        result = s.weather(**json.loads(call.function.arguments))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    s.check(litellm.completion(messages=messages, **options).choices[0].message.content)


def test_pydantic_ai(served):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    s = served()
    model = OpenAIChatModel("ardea", provider=OpenAIProvider(base_url=s.url, api_key="-"))
    agent = Agent(model, tools=[s.weather])
    s.check(agent.run_sync(QUESTION).output)


def test_smolagents_tool_calling_agent(served):
    """smolagents rewrites its own turns: it sends its tool call back as text and the tool's
    result as a user "Observation:" message, asks with stop sequences and
    tool_choice="required". Under history="keep_tokens" the episode is one row whose trained
    tokens are exactly those the engine produced, and each call's input is the previous
    call's tokens plus the new messages only."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    s = served((CALL, FINAL), history="keep_tokens")

    @tool
    def weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city.
        """
        return s.weather(city)

    model = OpenAIServerModel("ardea", api_base=s.url, api_key="-")
    agent = ToolCallingAgent(tools=[weather], model=model, max_steps=3, verbosity_level=0)
    answer = agent.run(QUESTION)
    first, second = s.client.interactions
    assert second.input_ids[: len(first.tokens)] == first.tokens
    assert s.engine.prompts[1] == second.input_ids
    s.check(answer)
