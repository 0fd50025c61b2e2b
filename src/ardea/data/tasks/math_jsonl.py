"""Math word problems from a local JSONL file of ``{"question", "answer"}`` objects.

The format is GSM8K's: ``answer`` is a worked solution ending in ``#### 42``; the final
answer is the text after the last ``####`` (or the whole answer when there is none).
Each :class:`Example` has the question plus a short instruction as its prompt, the final
answer as its ``answer`` (what answer-based rewards and evaluation check), and
``meta = {"question", "solution": <full answer text>, "source": "<file> line <n>"}``. SFT
trains on the final answer alone, or with ``demonstrate="solution"`` on the whole worked
solution (its ``#### 42`` line included: the example's ``demonstration``).

The held-out split is either a second file (``test_path``) or a ``test_fraction`` of the
distinct questions: those with the smallest keyed hash of their text under the seed, so
the split is deterministic, disjoint, and independent of the file's order. ``examples``
returns a seeded shuffle of a split: the test split without repeats (asking for more than
it holds is an error), the train split cycling through fresh shuffles when asked for more.

Scoring: when the final answer is a plain number, a completion is correct when its last
number equals it exactly (``"1,234"`` = ``"1234"``, ``"2.50"`` = ``"2.5"``); otherwise
math-verify compares the completion's answer (``\\boxed{}`` first) with it.
"""

from __future__ import annotations

import hashlib
import random
from fractions import Fraction
from pathlib import Path

from ardea.data.records import Record, read_records
from ardea.data.tasks.answers import last_number, math_answer, math_equal, parse_number
from ardea.data.tasks.base import SPLITS, Example, Task, register_task
from ardea.errors import ArdeaError, ConfigError

DEFAULT_INSTRUCTION = "End your answer with the final number."
DEMONSTRATIONS = ("answer", "solution")


def final_answer(answer: str) -> str:
    """The text after the last ``####`` of a GSM8K-style answer, else the whole answer."""
    return answer.rpartition("####")[2].strip()


def _problem(record: Record, instruction: str, solution: bool) -> Example:
    data = record.data
    for key in ("question", "answer"):
        if key not in data:
            raise record.error(
                f"missing key {key!r} (keys: {', '.join(map(str, data)) or 'none'}); "
                'each line must be {"question": ..., "answer": ...}'
            )
    question, answer = data["question"], data["answer"]
    if not isinstance(question, str) or not question.strip():
        raise record.error("'question' must be a non-empty string")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise record.error(f"'answer' must be a string or a number, got {type(answer).__name__}")
    final = final_answer(str(answer))
    if not final:
        raise record.error("'answer' has no final answer (nothing after '####')")
    prompt = f"{question.strip()}\n{instruction}" if instruction else question.strip()
    meta = {"question": question.strip(), "solution": str(answer), "source": record.where}
    demonstration = str(answer).strip() if solution and str(answer).strip() != final else None
    return Example(prompt, final, meta, demonstration)


def _read(path: str, instruction: str, what: str, solution: bool = False) -> list[Example]:
    if not isinstance(path, (str, Path)) or not str(path):
        raise ConfigError(f"data.task_args.{what}={path!r} must name a local JSONL file")
    return [_problem(record, instruction, solution) for record in read_records(path)]


@register_task("math_jsonl")
class MathJsonlTask(Task):
    """GSM8K-style word problems from a local JSONL file of {"question", "answer"} lines.

    Args:
        path: the JSONL file of ``{"question", "answer"}`` objects (required).
        test_fraction: share of its distinct questions held out (default 0.1); not
            allowed together with ``test_path``.
        test_path: a second file that is the whole held-out split (``path`` is then
            all training data).
        instruction: appended to each question on its own line ('' for none).
        seed: seed of the split and of the order of examples.
        demonstrate: what SFT trains on: ``answer`` (the final answer alone) or
            ``solution`` (the whole worked solution, its ``#### 42`` line included).
    """

    def __init__(
        self,
        path: str,
        test_fraction: float | None = None,
        test_path: str | None = None,
        instruction: str = DEFAULT_INSTRUCTION,
        seed: int = 0,
        demonstrate: str = "answer",
    ) -> None:
        if test_path is not None and test_fraction is not None:
            raise ConfigError(
                "data.task_args.test_fraction and data.task_args.test_path are both set; "
                "give one (test_path makes the whole of path the training split)"
            )
        if test_fraction is not None and not 0.0 < test_fraction < 1.0:
            raise ConfigError(f"data.task_args.test_fraction={test_fraction!r} must be in (0, 1)")
        if demonstrate not in DEMONSTRATIONS:
            raise ConfigError(
                f"data.task_args.demonstrate={demonstrate!r} must be one of: "
                + ", ".join(DEMONSTRATIONS)
            )
        self.seed = seed
        problems = _read(path, instruction, "path", demonstrate == "solution")
        if test_path is not None:
            self._splits = {"train": problems, "test": _read(test_path, instruction, "test_path")}
        else:
            self._splits = self._split(problems, 0.1 if test_fraction is None else test_fraction)
        for split, held in self._splits.items():
            if not held:
                raise ArdeaError(
                    f"{path}: the {split} split is empty ({len(problems)} distinct questions); "
                    "add problems or change data.task_args.test_fraction"
                )

    def _hash(self, question: str) -> int:
        key = f"{self.seed}:{question}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")

    def _split(self, problems: list[Example], fraction: float) -> dict[str, list[Example]]:
        questions = sorted({e.meta["question"] for e in problems}, key=lambda q: (self._hash(q), q))
        held_out = set(questions[: max(1, round(fraction * len(questions)))])
        return {
            "train": [e for e in problems if e.meta["question"] not in held_out],
            "test": [e for e in problems if e.meta["question"] in held_out],
        }

    def examples(self, split: str, n: int) -> list[Example]:
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}")
        pool = self._splits[split]
        if split == "test" and n > len(pool):
            raise ConfigError(
                f"asked for {n} held-out examples but the math_jsonl test split has only "
                f"{len(pool)}; lower data.eval_size"
            )
        rng = random.Random(f"math_jsonl:{self.seed}:{split}")
        out: list[Example] = []
        while len(out) < n:
            order = list(pool)
            rng.shuffle(order)
            out.extend(order[: n - len(out)])
        return out

    def score(self, completion: str, example: Example) -> float:
        return 1.0 if answers_match(example.answer, completion) else 0.0

    def extract_answer(self, completion: str, example: Example) -> Fraction | str | None:
        """As :meth:`score` reads it: the last number's exact value when the reference answer
        is a plain number, else math-verify's parse of the completion (as text)."""
        if parse_number(example.answer) is not None:
            return last_number(completion)
        return math_answer(completion)


def answers_match(gold: str, completion: str) -> bool:
    """Numeric match of the last number when ``gold`` is a plain number, else math-verify."""
    expected = parse_number(gold)
    if expected is not None:
        return last_number(completion) == expected
    return bool(math_equal(gold, completion))
