"""Guess-the-number as an OpenAI Agents SDK agent with a function tool: an agent
workflow ardea trains as it is.

The agent guesses by calling its ``guess`` tool, whose result (``higher``, ``lower`` or
``correct``) is the feedback; at most four guesses, reward 1 when the number is found. It
uses only the ``openai-agents`` package (``pip install openai-agents``) and no ardea import.
Each guess is one ``Runner.run`` that stops at the first tool call
(``tool_use_behavior="stop_on_first_tool"``); the next one continues from
``result.to_input_list()``, so ardea sees one growing conversation (one trajectory).

Train it (SFT on the ``guess_number`` environment's tool-calling demonstration games, then
turn-level PPO on this agent)::

    ardea train configs/agent_guess_number_agents_sdk.yaml

Play it against any OpenAI-compatible server, e.g. a trained model behind ``ardea serve``::

    ardea serve runs/agent_guess_number_agents_sdk/rl --port 8000 &
    python examples/agents/guess_number_agents_sdk.py --base-url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import asyncio

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

MAX_GUESSES = 4
set_tracing_disabled(True)  # traces would go to OpenAI's servers


async def run(client: AsyncOpenAI, row: dict) -> dict:
    """One game: ``row`` holds the ``target`` and the range's top ``high``."""
    target, high = int(row["target"]), int(row["high"])
    guesses: list[int] = []

    @function_tool
    def guess(number: int) -> str:
        """Guess the number: higher, lower or correct."""
        guesses.append(number)
        if number == target:
            return "correct"
        return "higher" if number < target else "lower"

    agent = Agent(
        name="player",
        model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
        tools=[guess],
        tool_use_behavior="stop_on_first_tool",
    )
    items: list = [{"role": "user", "content": f"guess 1-{high}"}]
    for _ in range(MAX_GUESSES):
        called = len(guesses)
        result = await Runner.run(agent, items)
        if target in guesses:
            return {"reward": 1.0, "success": True, "guesses": len(guesses)}
        items = result.to_input_list()
        if len(guesses) == called:  # answered without calling the tool
            items.append({"role": "user", "content": "call guess"})
    return {"reward": 0.0, "success": False, "guesses": len(guesses)}


async def play(base_url: str, games: int, high: int) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key="-")
    rows = [{"target": 1 + i % high, "high": high} for i in range(games)]
    results = await asyncio.gather(*(run(client, row) for row in rows))
    won = sum(r["success"] for r in results)
    print(f"{won} of {games} games won ({won / games:.1%})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--games", type=int, default=16)
    parser.add_argument("--high", type=int, default=16)
    args = parser.parse_args()
    asyncio.run(play(args.base_url, args.games, args.high))
