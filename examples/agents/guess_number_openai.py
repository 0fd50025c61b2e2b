"""Guess-the-number as plain OpenAI SDK code: an agent workflow ardea trains as it is.

The game of ardea's ``guess_number`` environment, written the way agent code is written
for any OpenAI-compatible server, with no ardea import: ask for a guess, answer
``higher`` or ``lower``, at most four guesses; reward 1 when the number is found.

Train it (SFT on demonstration games, then turn-level PPO on this workflow)::

    ardea train configs/agent_guess_number_openai.yaml

``agent.workflow: examples/agents/guess_number_openai.py:run`` names :func:`run`; ardea
calls it ``rollout.group_size`` times per row of ``data.path`` with an
``openai.AsyncOpenAI`` client whose calls its policy serves and records.

Play it against any OpenAI-compatible server, e.g. a trained model behind ``ardea serve``::

    ardea serve runs/agent_guess_number_openai/rl --port 8000 &
    python examples/agents/guess_number_openai.py --base-url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import asyncio
import re

from openai import AsyncOpenAI

MAX_GUESSES = 4


def first_int(text: str) -> int | None:
    """The first integer written in ``text`` (None when there is none)."""
    match = re.search(r"-?\d+", text)
    return int(match.group()) if match else None


async def run(client: AsyncOpenAI, row: dict) -> dict:
    """One game: ``row`` holds the ``target`` and the range's top ``high``."""
    target, high = int(row["target"]), int(row["high"])
    messages = [{"role": "user", "content": f"guess 1-{high}"}]
    for guesses in range(1, MAX_GUESSES + 1):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        text = reply.choices[0].message.content or ""
        guess = first_int(text)
        if guess == target:
            return {"reward": 1.0, "success": True, "guesses": guesses}
        feedback = "a number" if guess is None else "higher" if guess < target else "lower"
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": feedback}]
    return {"reward": 0.0, "success": False, "guesses": MAX_GUESSES}


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
