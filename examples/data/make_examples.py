"""Write the small example datasets of this directory (deterministic: same files every run).

    python examples/data/make_examples.py

- ``chat.jsonl``        200 short multi-turn ChatML conversations (``{"messages": [...]}``)
                        with a system message in about a third: arithmetic and small facts.
- ``text.jsonl``        200 lines of plain text (``{"text": ...}``).
- ``preference.jsonl``  300 arithmetic prompts with a correct (chosen) and a wrong
                        (rejected) answer (``{"prompt", "chosen", "rejected"}``).
- ``labeled.jsonl``     300 arithmetic prompts, each with one answer, right
                        (``label: true``) or wrong (``false``), about half each
                        (``{"prompt", "completion", "label"}``, KTO's format).
- ``groups.jsonl``      200 arithmetic prompts with 4 completions each and 0/1 rewards
                        (``{"prompt", "completions", "rewards"}``).
- ``prompts.jsonl``     200 arithmetic prompts for online RL with their answer and the
                        operands (``{"prompt", "answer", "operands"}``): every column but
                        the prompt reaches the reward functions.
- ``guess_number_train.jsonl`` / ``guess_number_eval.jsonl``  the rows of an agent
                        workflow playing guess-the-number 1..16 (``{"target", "high"}``):
                        2000 training games with the targets the ``guess_number``
                        environment draws for ``data.seed=0``, in its order, and the 16
                        held-out games 1..16.
- ``tinker_sft.jsonl``  400 tinker-cookbook arithmetic questions ("What is 37 + 52?",
                        operands 0..100) with their answers as conversations, for the
                        cookbook's chat SFT recipe (``docs/tinker.md``).
- ``tinker_comparisons.jsonl``  32 such questions with a right and a wrong answer in the
                        cookbook's comparison format, for its DPO recipe.

Prompts use the built-in arithmetic task's format (``"23+58="``), answers are bare numbers,
so a tiny character-level model learns them quickly.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent

SYSTEMS = ("You are a tiny helpful assistant.", "Answer briefly.", "You do sums.")
FACTS = (
    ("What color is the sky?", "Blue."),
    ("What color is grass?", "Green."),
    ("How many legs does a cat have?", "Four."),
    ("How many days are in a week?", "Seven."),
    ("What is the capital of France?", "Paris."),
    ("What is the capital of Italy?", "Rome."),
    ("What do bees make?", "Honey."),
    ("Is ice cold or hot?", "Cold."),
    ("What comes after Monday?", "Tuesday."),
    ("How many hours are in a day?", "24."),
)
GREETINGS = (("Hi!", "Hello! Ask me a sum."), ("Thanks!", "You are welcome."))
SUBJECTS = ("The cat", "A small dog", "The old man", "My sister", "The teacher", "A bird")
VERBS = ("sees", "likes", "finds", "draws", "counts", "carries")
OBJECTS = ("a red ball", "three apples", "the blue door", "a long road", "two stones", "the moon")
ENDINGS = (
    "in the morning.",
    "after lunch.",
    "every day.",
    "at night.",
    "near the river.",
    "again.",
)


def _sum(rng: random.Random, digits: int = 2) -> tuple[str, int]:
    a, b = rng.randrange(10**digits), rng.randrange(10**digits)
    return f"{a}+{b}=", a + b


def _wrong(rng: random.Random, answer: int) -> int:
    """A plausible wrong answer: off by 1..10 or with its last two digits swapped."""
    text = str(answer)
    if len(text) >= 2 and text[-1] != text[-2] and rng.random() < 0.3:
        return int(text[:-2] + text[-1] + text[-2])
    wrong = answer + rng.choice([-1, 1]) * rng.randint(1, 10)
    return wrong if wrong >= 0 else answer + rng.randint(1, 10)


def _turn(rng: random.Random) -> tuple[str, str]:
    kind = rng.random()
    if kind < 0.55:
        prompt, answer = _sum(rng)
        return rng.choice(("What is {}", "{}", "Compute {}")).format(prompt[:-1] + "?"), str(answer)
    if kind < 0.9:
        return rng.choice(FACTS)
    return rng.choice(GREETINGS)


def chat(rng: random.Random, n: int = 200) -> list[dict]:
    rows = []
    for _ in range(n):
        messages = []
        if rng.random() < 0.35:
            messages.append({"role": "system", "content": rng.choice(SYSTEMS)})
        for _ in range(rng.choice((1, 2, 2, 3))):
            question, answer = _turn(rng)
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": answer})
        rows.append({"messages": messages})
    return rows


def text(rng: random.Random, n: int = 200) -> list[dict]:
    rows = []
    for _ in range(n):
        if rng.random() < 0.3:
            prompt, answer = _sum(rng)
            rows.append({"text": f"{prompt}{answer}"})
        else:
            words = (
                rng.choice(SUBJECTS),
                rng.choice(VERBS),
                rng.choice(OBJECTS),
                rng.choice(ENDINGS),
            )
            rows.append({"text": " ".join(words)})
    return rows


def preference(rng: random.Random, n: int = 300) -> list[dict]:
    rows = []
    for _ in range(n):
        prompt, answer = _sum(rng)
        rows.append({"prompt": prompt, "chosen": str(answer), "rejected": str(_wrong(rng, answer))})
    return rows


def labeled(rng: random.Random, n: int = 300) -> list[dict]:
    rows = []
    for _ in range(n):
        prompt, answer = _sum(rng)
        right = rng.random() < 0.5
        completion = str(answer) if right else str(_wrong(rng, answer))
        rows.append({"prompt": prompt, "completion": completion, "label": right})
    return rows


def groups(rng: random.Random, n: int = 200, size: int = 4) -> list[dict]:
    rows = []
    for _ in range(n):
        prompt, answer = _sum(rng)
        correct = [rng.random() < 0.5 for _ in range(size)]
        completions = [str(answer) if ok else str(_wrong(rng, answer)) for ok in correct]
        rewards = [1.0 if ok else 0.0 for ok in correct]
        rows.append({"prompt": prompt, "completions": completions, "rewards": rewards})
    return rows


def prompts(rng: random.Random, n: int = 200) -> list[dict]:
    rows = []
    for _ in range(n):
        prompt, answer = _sum(rng)
        operands = [int(x) for x in prompt[:-1].split("+")]
        rows.append({"prompt": prompt, "answer": str(answer), "operands": operands})
    return rows


def tinker_sft(rng: random.Random, n: int = 400) -> list[dict]:
    """tinker-cookbook's arithmetic questions ("What is a + b?", a, b in 0..100) answered."""
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 100), rng.randint(0, 100)
        rows.append({"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                                  {"role": "assistant", "content": str(a + b)}]})  # fmt: skip
    return rows


def tinker_comparisons(rng: random.Random, n: int = 32) -> list[dict]:
    """tinker-cookbook's comparison records (its JSONL loader's format): the right sum is
    completion A or B at random, and ``label`` names it."""
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 100), rng.randint(0, 100)
        right, wrong = str(a + b), str(_wrong(rng, a + b))
        label = rng.choice("AB")
        first, second = (right, wrong) if label == "A" else (wrong, right)
        rows.append({
            "comparison": {
                "prompt_conversation": [{"role": "user", "content": f"What is {a} + {b}?"}],
                "completion_A": [{"role": "assistant", "content": first}],
                "completion_B": [{"role": "assistant", "content": second}],
            },
            "label": label,
        })  # fmt: skip
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def guess_number(split: str, count: int = 2000, seed: int = 0, high: int = 16) -> list[dict]:
    """The guess_number environment's rows (same draws, same order), with ``high``."""
    if split == "eval":
        return [{"target": t, "high": high} for t in range(1, high + 1)]
    rng = random.Random(seed)
    return [{"target": rng.randint(1, high), "high": high} for _ in range(count)]


def main() -> None:
    for name, make, seed in (
        ("chat", chat, 1),
        ("text", text, 2),
        ("preference", preference, 3),
        ("groups", groups, 4),
        ("prompts", prompts, 5),
        ("labeled", labeled, 6),
        ("tinker_sft", tinker_sft, 7),
        ("tinker_comparisons", tinker_comparisons, 8),
    ):
        rows = make(random.Random(seed))
        write_jsonl(HERE / f"{name}.jsonl", rows)
        print(f"wrote {len(rows)} records to {HERE / f'{name}.jsonl'}")
    for split in ("train", "eval"):
        path = HERE / f"guess_number_{split}.jsonl"
        write_jsonl(path, guess_number(split))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
