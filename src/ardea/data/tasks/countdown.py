"""Countdown: reach a target from given numbers with + - * / and parentheses.

Prompt ``"3 7 25 50 -> 82:"`` (the numbers in ascending order, then the target); the
completion is an arithmetic expression such as ``"7+3*25"`` (no ``=``, no result). It
scores 1 when it parses safely (Python ``ast``: nothing but integer literals, ``+ - * /``
and parentheses; never ``eval``), uses each given number at most as often as it is given,
and equals the target exactly under :class:`fractions.Fraction` arithmetic (intermediate
fractions such as ``(7-25/50)*...`` are allowed).

Problems are generated from a seed: ``count`` distinct numbers in ``[1, max_number]``, and
a target in ``[1, max_target]``, not one of the numbers, computed by a random expression
over ``min_ops + 1`` or more of them whose intermediate results are positive integers
(division only when exact). The reference answer comes from :func:`solve`, a small
exhaustive deterministic solver that returns an expression with the fewest operations
(and only the parentheses needed), so a problem always has the same demonstration. As
with ``arithmetic``, whether a problem is held out is a keyed hash of the problem itself,
so the splits are disjoint and the test split does not depend on how many training
examples were drawn.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from collections import Counter
from fractions import Fraction

from ardea.data.tasks.base import SPLITS, Example, Task, register_task
from ardea.errors import ConfigError

MAX_EXPRESSION_CHARS = 200
_ALLOWED_CHARS = re.compile(r"[0-9+\-*/() ]*")
_PROMPT = re.compile(r"\s*((?:\d+ )*\d+) -> (\d+):\s*")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}

# Expression strings carry a precedence so the solver writes only the parentheses needed.
_ATOM, _PRODUCT, _SUM = 3, 2, 1


def _combine(a: tuple[int, str, int], b: tuple[int, str, int], op: str):
    """``a op b`` as (value, text, precedence), or None when not a positive integer."""
    (x, sx, px), (y, sy, py) = a, b
    if op == "+":
        return x + y, f"{sx}+{sy}", _SUM
    if op == "-":
        if x <= y:
            return None
        return x - y, f"{sx}-{sy if py > _SUM else f'({sy})'}", _SUM
    left = sx if px > _SUM else f"({sx})"
    if op == "*":
        return x * y, f"{left}*{sy if py > _SUM else f'({sy})'}", _PRODUCT
    if y == 0 or x % y:
        return None
    return x // y, f"{left}/{sy if py == _ATOM else f'({sy})'}", _PRODUCT


def _children(items: list[tuple[int, str, int]]):
    """Every list obtained by replacing two items with one combination of them."""
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            rest = items[:i] + items[i + 1 : j] + items[j + 1 :]
            a, b = items[i], items[j]
            for left, right, op in ((a, b, "+"), (a, b, "*"), (a, b, "-"), (b, a, "-")):
                if (new := _combine(left, right, op)) is not None:
                    yield rest + [new]
            for left, right in ((a, b), (b, a)):
                if (new := _combine(left, right, "/")) is not None:
                    yield rest + [new]


def _search(items, target: int, merges: int, failed: set) -> str | None:
    for value, text, _ in items:
        if value == target:
            return text
    if merges == 0 or len(items) < 2:
        return None
    key = (tuple(sorted(value for value, _, _ in items)), merges)
    if key in failed:
        return None
    for child in _children(items):
        if (found := _search(child, target, merges - 1, failed)) is not None:
            return found
    failed.add(key)
    return None


def _solve(numbers: list[int], target: int) -> tuple[str, int] | None:
    items = [(n, str(n), _ATOM) for n in sorted(numbers)]
    failed: set = set()
    for merges in range(len(items)):
        if (found := _search(items, target, merges, failed)) is not None:
            return found, merges
    return None


def solve(numbers: list[int], target: int) -> str | None:
    """An expression over ``numbers`` (each used at most once) equal to ``target``, using
    as few numbers as possible, or None. Deterministic; searches expressions whose
    intermediate results are positive integers (division only when exact)."""
    found = _solve(numbers, target)
    return None if found is None else found[0]


def _value(node: ast.AST) -> Fraction:
    """Exact value of an expression tree that passed :func:`_is_safe`."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    assert isinstance(node, ast.BinOp)
    left, right = _value(node.left), _value(node.right)
    op = _OPS[type(node.op)]
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    return left / right  # ZeroDivisionError is handled by the caller


def _is_safe(node: ast.AST) -> bool:
    """Only integer literals and binary + - * / (parentheses leave no node)."""
    if isinstance(node, ast.Constant):
        return type(node.value) is int
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _is_safe(node.left) and _is_safe(node.right)
    return False


def check_expression(text: str, numbers: list[int], target: int) -> bool:
    """Whether ``text`` is a safe expression over ``numbers`` (each at most as often as
    given) whose exact value is ``target``. Never evaluates code."""
    text = text.strip()
    if not text or len(text) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.fullmatch(text):
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if not _is_safe(tree.body):
        return False
    used = [n.value for n in ast.walk(tree.body) if isinstance(n, ast.Constant)]
    if Counter(used) - Counter(numbers):  # a number not given, or used too often
        return False
    try:
        return _value(tree.body) == target
    except ZeroDivisionError:
        return False


def parse_prompt(prompt: str) -> tuple[list[int], int] | None:
    """``"3 7 25 50 -> 81:"`` → ([3, 7, 25, 50], 81), or None for another format."""
    match = _PROMPT.fullmatch(prompt)
    if not match:
        return None
    return [int(n) for n in match.group(1).split()], int(match.group(2))


@register_task("countdown")
class CountdownTask(Task):
    """Reach a target from given numbers with + - * / and parentheses, each number at most once.

    Args:
        count: how many numbers a problem gives, in [2, 5].
        max_number: the numbers are distinct integers in ``[1, max_number]``.
        max_target: targets are integers in ``[1, max_target]``.
        min_ops: keep only problems whose shortest solution needs at least this many
            operations (1 .. count-1); raise it for harder problems.
        test_fraction: share of all problems reserved for the held-out split.
        seed: seed of the split and of the draws.
    """

    def __init__(
        self,
        count: int = 4,
        max_number: int = 50,
        max_target: int = 100,
        min_ops: int = 1,
        test_fraction: float = 0.1,
        seed: int = 0,
    ) -> None:
        if not isinstance(count, int) or not 2 <= count <= 5:
            raise ConfigError(f"data.task_args.count={count!r} must be an integer in [2, 5]")
        if not isinstance(max_number, int) or not count <= max_number <= 10_000:
            raise ConfigError(
                f"data.task_args.max_number={max_number!r} must be an integer in "
                f"[count, 10000] (count={count} distinct numbers are drawn from 1..max_number)"
            )
        if not isinstance(max_target, int) or not 1 <= max_target <= 1_000_000:
            raise ConfigError(
                f"data.task_args.max_target={max_target!r} must be an integer in [1, 1000000]"
            )
        if not isinstance(min_ops, int) or not 1 <= min_ops < count:
            raise ConfigError(
                f"data.task_args.min_ops={min_ops!r} must be an integer in [1, count-1={count - 1}]"
            )
        if not 0.0 < test_fraction < 1.0:
            raise ConfigError(f"data.task_args.test_fraction={test_fraction!r} must be in (0, 1)")
        self.min_ops = min_ops
        self.count = count
        self.max_number = max_number
        self.max_target = max_target
        self.test_fraction = test_fraction
        self.seed = seed

    def _is_test(self, numbers: tuple[int, ...], target: int) -> bool:
        key = f"{self.seed}:{' '.join(map(str, numbers))}->{target}".encode()
        bucket = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
        return bucket / 2**64 < self.test_fraction

    def _draw(self, rng: random.Random) -> tuple[tuple[int, ...], int] | None:
        """One problem: sorted numbers and a target reached by a random expression."""
        numbers = sorted(rng.sample(range(1, self.max_number + 1), self.count))
        pool = [
            (n, str(n), _ATOM)
            for n in rng.sample(numbers, rng.randint(self.min_ops + 1, self.count))
        ]
        while len(pool) > 1:
            a = pool.pop(rng.randrange(len(pool)))
            b = pool.pop(rng.randrange(len(pool)))
            a, b = max(a, b), min(a, b)  # larger first, so - and / have a chance
            combined = _combine(a, b, rng.choice("+-*/"))
            if combined is None:
                return None
            pool.append(combined)
        target = pool[0][0]
        if not 1 <= target <= self.max_target or target in numbers:
            return None
        return tuple(numbers), target

    def examples(self, split: str, n: int) -> list[Example]:
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}")
        want_test = split == "test"
        rng = random.Random(f"countdown:{self.seed}:{split}")
        seen: set[tuple[tuple[int, ...], int]] = set()
        out: list[Example] = []
        misses = 0  # draws since the last accepted problem
        while len(out) < n:
            misses += 1
            if misses > 20_000:
                raise ConfigError(
                    f"found only {len(out)} of {n} "
                    f"{'distinct held-out' if want_test else 'training'} countdown problems with "
                    f"count={self.count}, max_number={self.max_number}, "
                    f"max_target={self.max_target}; lower data.eval_size or widen the ranges"
                )
            problem = self._draw(rng)
            if problem is None or self._is_test(*problem) != want_test:
                continue
            if want_test:  # the held-out split has no repeats; train samples with replacement
                if problem in seen:
                    continue
                seen.add(problem)
            numbers, target = problem
            found = _solve(list(numbers), target)
            assert found is not None  # the drawn expression is in the solver's search space
            answer, ops = found
            if ops < self.min_ops:
                continue
            prompt = f"{' '.join(map(str, numbers))} -> {target}:"
            out.append(Example(prompt, answer, {"numbers": list(numbers), "target": target}))
            misses = 0
        return out

    def score(self, completion: str, example: Example) -> float:
        if "numbers" in example.meta and "target" in example.meta:
            numbers, target = list(example.meta["numbers"]), int(example.meta["target"])
        elif (parsed := parse_prompt(example.prompt)) is not None:
            numbers, target = parsed
        else:
            raise ValueError(
                f"countdown example has neither meta numbers/target nor a prompt like "
                f"'3 7 25 50 -> 81:': {example.prompt[:80]!r}"
            )
        return 1.0 if check_expression(completion, numbers, target) else 0.0

    def extract_answer(self, completion: str, example: Example) -> str | None:
        """The expression with its whitespace removed (None when empty): two spellings of
        one expression vote together, two different expressions apart."""
        return "".join(completion.split()) or None
