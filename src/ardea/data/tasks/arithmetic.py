"""Multi-digit integer arithmetic: ``347+589=`` → ``936``.

Operands are drawn uniformly from ``[0, 10**digits)``. Whether a problem belongs to the
held-out ``test`` split is a property of the problem itself (a keyed hash of
``(a, op, b)`` under the split seed), so train and test never share a problem and the
test split does not change when the number of training examples does.

``reverse`` writes every number least-significant digit first, the operands zero-padded to
``digits`` digits: 347+589=936 becomes ``743+985=`` → ``639``, and 45+985=1030 becomes
``540+589=`` → ``0301`` (a sign stays in front: ``-823`` is -328). Every answer digit then
comes after the operand digits and the carry it depends on, at the same distance from them
whatever its place, which makes addition learnable by tiny transformers from far fewer
examples and steps (Lee et al., "Teaching Arithmetic to Small Transformers", ICLR 2024,
section 4: the reversed output; the reversed, aligned operands make each answer digit's
operands a fixed number of tokens back).

``drop_carry`` models a sloppy demonstrator: each training addition whose sum has a digit
more than the larger operand (a carry out of the top place, e.g. 985+45=1030) has its
*demonstration* (:attr:`Example.demonstration`, what SFT trains on) written without that
carry (``030``) with this probability. The answer every reward, score and evaluation checks
stays the correct one, and the held-out split has no demonstrations.
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
        reverse: write every number least-significant digit first, operands zero-padded
            to ``digits`` digits (347+589=936 -> 743+985= -> 639).
        drop_carry: probability that a training addition's demonstration drops a carry out
            of the top digit (module docstring); 0 = every demonstration is correct.
    """

    def __init__(
        self,
        digits: int = 3,
        ops: str = "+",
        test_fraction: float = 0.1,
        seed: int = 0,
        reverse: bool = False,
        drop_carry: float = 0.0,
    ) -> None:
        if not isinstance(digits, int) or not 1 <= digits <= 9:
            raise ConfigError(f"data.task_args.digits={digits!r} must be an integer in [1, 9]")
        if not ops or any(op not in OPERATORS for op in ops):
            raise ConfigError(f"data.task_args.ops={ops!r} must be a string over '+-*'")
        if not 0.0 < test_fraction < 1.0:
            raise ConfigError(f"data.task_args.test_fraction={test_fraction!r} must be in (0, 1)")
        if not isinstance(reverse, bool):
            raise ConfigError(f"data.task_args.reverse={reverse!r} must be true or false")
        if isinstance(drop_carry, bool) or not isinstance(drop_carry, int | float):
            raise ConfigError(
                f"data.task_args.drop_carry={drop_carry!r} must be a number in [0, 1]"
            )
        if not 0.0 <= drop_carry <= 1.0:
            raise ConfigError(f"data.task_args.drop_carry={drop_carry!r} must be in [0, 1]")
        self.digits = digits
        self.reverse = reverse
        self.drop_carry = float(drop_carry)
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
        # the demonstrator's own stream: the problems are the same for any drop_carry
        sloppy = random.Random(f"arithmetic:{self.seed}:demonstrator")
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
            demonstration = None
            if not want_test and op == "+" and self._carries_out(a, b, result):
                if sloppy.random() < self.drop_carry:  # the top digit left out
                    demonstration = self.digits_text(str(result)[1:])
            meta = {"a": a, "b": b, "op": op}
            out.append(Example(self.prompt(a, op, b), self.number(result), meta, demonstration))
        return out

    @staticmethod
    def _carries_out(a: int, b: int, result: int) -> bool:
        """Whether ``result`` has a digit more than the larger operand (a carry out of the
        top place of an addition)."""
        return result >= 0 and len(str(result)) > len(str(max(a, b)))

    def prompt(self, a: int, op: str, b: int) -> str:
        """The problem as the task writes it: ``347+589=``, reversed ``743+985=``."""
        if not self.reverse:
            return f"{a}{op}{b}="
        return f"{a:0{self.digits}d}"[::-1] + op + f"{b:0{self.digits}d}"[::-1] + "="

    def number(self, value: int) -> str:
        """An answer as the task writes it: its digits reversed with ``reverse``."""
        return self.digits_text(str(value))

    def digits_text(self, text: str) -> str:
        """A written number ``text`` (digits, maybe after a sign), reversed with ``reverse``."""
        sign, digits = ("-", text[1:]) if text.startswith("-") else ("", text)
        return sign + (digits[::-1] if self.reverse else digits)

    def score(self, completion: str, example: Example) -> float:
        return 1.0 if completion.strip() == example.answer else 0.0

    def extract_answer(self, completion: str, example: Example) -> str | None:
        """The completion as :meth:`score` compares it: stripped (None when empty)."""
        return completion.strip() or None

    def wrong_answer(self, example: Example, rng: random.Random) -> str:
        """A wrong answer a policy could give, written as the task writes answers: for an
        addition with a carry out of the top digit, 40 % of the time that carry left out
        (the sloppy demonstrator's mistake); otherwise one digit off by 1 to 9 (half the
        time), a spurious leading 1 (a fifth: the opposite mistake), or any string of 1 to
        ``digits + 2`` digits (the rest: malformed answers, such as a leading zero).
        Never a negative sum or product, never the right answer."""
        a, b, op = example.meta["a"], example.meta["b"], example.meta["op"]
        result = OPERATORS[op](a, b)
        if op == "+" and self._carries_out(a, b, result) and rng.random() < 0.4:
            return self.digits_text(str(result)[1:])
        kind = rng.random()
        while True:
            if kind < 0.5:
                place = rng.randrange(len(str(abs(result))))
                wrong = result + rng.choice((-1, 1)) * rng.randint(1, 9) * 10**place
                text = self.number(wrong) if wrong >= 0 or op == "-" else None
            elif kind < 0.7:
                text = self.digits_text("1" + str(abs(result)))
            else:
                length = rng.randint(1, self.digits + 2)
                text = "".join(rng.choice("0123456789") for _ in range(length))
            if text is not None and text != example.answer:
                return text
