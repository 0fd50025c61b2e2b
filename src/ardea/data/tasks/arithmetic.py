"""Multi-digit integer arithmetic: ``347+589=`` → ``936``.

Operands are drawn uniformly from ``[0, 10**digits)``. Whether a problem belongs to the
held-out ``test`` split is a property of the problem itself (a keyed hash of
``(a, op, b)`` under the split seed), so train and test never share a problem and the
test split does not change when the number of training examples does.

With ``reverse`` the answer is written least-significant digit first (``347+589=`` →
``639``; a sign stays in front: ``12-340=`` → ``-823``). A model that writes left to right
then produces each digit after the operand digits and the carry it depends on, which makes
addition learnable by tiny transformers from far fewer examples (Lee et al., "Teaching
Arithmetic to Small Transformers", ICLR 2024: the "reverse" output format).
"""

from __future__ import annotations

import hashlib
import random

from ardea.data.tasks.base import SPLITS, Example, Task, register_task
from ardea.errors import ConfigError

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@register_task("arithmetic")
class ArithmeticTask(Task):
    """Integer arithmetic such as 347+589= -> 936, scored by exact match.

    Args:
        digits: largest operand has this many digits (operands in ``[0, 10**digits)``).
        ops: the operators to draw from, a string over ``+-*``.
        test_fraction: share of all problems reserved for the held-out split.
        seed: seed of the split and of the draws.
        reverse: write the answer's digits least-significant first (347+589= -> 639).
    """

    def __init__(
        self,
        digits: int = 3,
        ops: str = "+",
        test_fraction: float = 0.1,
        seed: int = 0,
        reverse: bool = False,
    ) -> None:
        if not isinstance(digits, int) or not 1 <= digits <= 9:
            raise ConfigError(f"data.task_args.digits={digits!r} must be an integer in [1, 9]")
        if not ops or any(op not in OPERATORS for op in ops):
            raise ConfigError(f"data.task_args.ops={ops!r} must be a string over '+-*'")
        if not 0.0 < test_fraction < 1.0:
            raise ConfigError(f"data.task_args.test_fraction={test_fraction!r} must be in (0, 1)")
        if not isinstance(reverse, bool):
            raise ConfigError(f"data.task_args.reverse={reverse!r} must be true or false")
        self.digits = digits
        self.reverse = reverse
        self.ops = "".join(dict.fromkeys(ops))
        self.test_fraction = test_fraction
        self.seed = seed

    def _is_test(self, a: int, op: str, b: int) -> bool:
        key = f"{self.seed}:{a}{op}{b}".encode()
        bucket = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
        return bucket / 2**64 < self.test_fraction

    def _problem_count(self) -> int:
        return len(self.ops) * 10 ** (2 * self.digits)

    def examples(self, split: str, n: int) -> list[Example]:
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}")
        want_test = split == "test"
        capacity = self._problem_count() * (
            self.test_fraction if want_test else 1 - self.test_fraction
        )
        if want_test and n > 0.8 * capacity:
            raise ConfigError(
                f"asked for {n} held-out examples but {self.digits}-digit {self.ops!r} arithmetic "
                f"has only about {int(capacity)}; lower data.eval_size or raise digits"
            )
        rng = random.Random(f"arithmetic:{self.seed}:{split}")
        high = 10**self.digits - 1
        seen: set[tuple[int, str, int]] = set()
        out: list[Example] = []
        while len(out) < n:
            a, b = rng.randint(0, high), rng.randint(0, high)
            op = rng.choice(self.ops)
            if self._is_test(a, op, b) != want_test:
                continue
            if want_test:  # the held-out split has no repeats; train samples with replacement
                if (a, op, b) in seen:
                    continue
                seen.add((a, op, b))
            result = OPERATORS[op](a, b)
            out.append(Example(f"{a}{op}{b}=", self.answer(result), {"a": a, "b": b, "op": op}))
        return out

    def answer(self, result: int) -> str:
        """``result`` as the task writes it: its digits reversed with ``reverse``."""
        sign, digits = ("-", str(-result)) if result < 0 else ("", str(result))
        return sign + (digits[::-1] if self.reverse else digits)

    def score(self, completion: str, example: Example) -> float:
        return 1.0 if completion.strip() == example.answer else 0.0
