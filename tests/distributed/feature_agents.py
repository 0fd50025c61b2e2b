"""An environment and a workflow for the torchrun feature runs (features.py) whose rewards
vary with what the policy says: a tiny random policy rarely wins a real game, and a step
whose rewards are all equal has no gradient to compare. A reply scores the fraction of its
characters that are ASCII letters (about a fifth of the char tokenizer's symbols).

Their episodes differ in shape the way real agents' do, so that a rollout's rows are not in
group order: an environment episode ends early when a reply holds no letter (episodes of 1 to
3 turns: rows arrive in the order episodes finish, a group's rows apart), and a workflow
episode whose first reply holds no letter starts a second conversation (two rows: groups of
uneven size)."""

from __future__ import annotations

from ardea.agent.env import Environment, StepResult


def letters(text: str) -> float:
    return sum(c.isascii() and c.isalpha() for c in text) / max(1, len(text))


class LettersEnv(Environment):
    """Up to three replies per episode, each rewarded with its share of letters; a reply
    without a letter ends the episode."""

    @classmethod
    def rows(cls, count, seed, *, split, **_):
        return [{"turns": 3} for _ in range(count)]

    def reset(self, row):
        self.left = int(row["turns"])
        return [{"role": "user", "content": "say something"}]

    def step(self, reply):
        self.left -= 1
        share = letters(reply)
        return StepResult(
            [{"role": "user", "content": "again"}], share, self.left == 0 or share == 0, {}
        )


async def run(client, row) -> float:
    """Two calls, the second continuing the first, or, when the first reply holds no letter,
    a conversation of its own; the reward is their share of letters."""
    messages = [{"role": "user", "content": "say something"}]
    first = await client.chat.completions.create(model="policy", messages=messages)
    text = first.choices[0].message.content or ""
    if letters(text) == 0:
        messages = [{"role": "user", "content": "try again"}]
    else:
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "again"}]
    second = await client.chat.completions.create(model="policy", messages=messages)
    return (letters(text) + letters(second.choices[0].message.content or "")) / 2
