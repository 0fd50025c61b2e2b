"""An environment and a workflow for the torchrun feature runs (features.py) whose rewards
vary with what the policy says: a tiny random policy rarely wins a real game, and a step
whose rewards are all equal has no gradient to compare. A reply scores the fraction of its
characters that are ASCII letters (about a fifth of the char tokenizer's symbols)."""

from __future__ import annotations

from ardea.agent.env import Environment, StepResult


def letters(text: str) -> float:
    return sum(c.isascii() and c.isalpha() for c in text) / max(1, len(text))


class LettersEnv(Environment):
    """Two replies per episode, each rewarded with its share of letters."""

    @classmethod
    def rows(cls, count, seed, *, split, **_):
        return [{"turns": 2} for _ in range(count)]

    def reset(self, row):
        self.left = int(row["turns"])
        return [{"role": "user", "content": "say something"}]

    def step(self, reply):
        self.left -= 1
        return StepResult(
            [{"role": "user", "content": "again"}], letters(reply), self.left == 0, {}
        )


async def run(client, row) -> float:
    """Two calls, the second continuing the first; the reward is their share of letters."""
    messages = [{"role": "user", "content": "say something"}]
    first = await client.chat.completions.create(model="policy", messages=messages)
    text = first.choices[0].message.content or ""
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "again"}]
    second = await client.chat.completions.create(model="policy", messages=messages)
    return (letters(text) + letters(second.choices[0].message.content or "")) / 2
