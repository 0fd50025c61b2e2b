"""Built-in environments the tiny model can learn on a CPU.

``guess_number``: the environment picks a number in ``1..high``; each reply is a guess
(the first integer in it) and the environment answers ``higher``, ``lower`` or
``correct``. Reward 1 for a correct guess within ``agent.max_turns`` replies, else 0.
Bisection needs ``ceil(log2(high + 1))`` guesses. With ``tool: true`` a guess is a call of
the ``guess`` tool (``<tool_call>{"name": "guess", "arguments": {"number": 8}}
</tool_call>``) whose result, a ``tool`` message, is the answer; a reply without a call
gets ``call guess`` (the game as an agent with a function tool plays it).

``calculator``: an arithmetic word problem ("what is 17 plus 25?"); the model may call the
``calculator`` tool (``<tool_call>{"name": "calculator", "arguments": {"expression":
"17+25"}}</tool_call>``), sees its result as a tool message, and answers with a number.
Reward 1 when the answer (the first integer of a reply without a tool call) is right.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re
from typing import Any

from ardea.agent.env import Environment, Message, StepResult, register_env
from ardea.agent.reply import Reply
from ardea.agent.tools import ToolBox, ToolCall
from ardea.errors import ConfigError

_INT = re.compile(r"-?\d+")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_WORDS = {"+": "plus", "-": "minus", "*": "times"}


def first_int(text: str) -> int | None:
    """The first integer written in ``text`` (None when there is none)."""
    match = _INT.search(text)
    return int(match.group()) if match else None


@register_env("guess_number")
class GuessNumber(Environment):
    """Guess a number in ``1..high`` from higher/lower feedback (module docstring)."""

    def __init__(self, *, max_turns: int = 4, high: int = 8, tool: bool = False) -> None:
        super().__init__(max_turns=max_turns)
        if isinstance(high, bool) or not isinstance(high, int) or high < 2:
            raise ConfigError(f"agent.env_args.high must be an int >= 2, got {high!r}")
        if not isinstance(tool, bool):
            raise ConfigError(f"agent.env_args.tool must be true or false, got {tool!r}")
        self.high = high
        self.target = 0
        if tool:
            self.toolbox = ToolBox({"guess": self.guess})

    def guess(self, number: int) -> str:
        """Guess the number: higher, lower or correct."""
        if number == self.target:
            return "correct"
        return "higher" if number < self.target else "lower"

    @classmethod
    def rows(cls, count: int, seed: int, *, split: str, high: int = 8, **_: Any) -> list[dict]:
        """Training games draw targets at random; the held-out games (``eval``) are every
        target ``1..high`` once, repeated to ``count`` at most."""
        if split == "eval":
            return [{"target": 1 + i % high} for i in range(min(count, high))]
        rng = random.Random(seed)
        return [{"target": rng.randint(1, high)} for _ in range(count)]

    def reset(self, row: dict[str, Any]) -> list[Message]:
        self.target = int(row["target"])
        return [{"role": "user", "content": f"guess 1-{self.high}"}]

    def step(self, reply: Reply) -> StepResult:
        if self.toolbox is not None:
            return self._tool_step(reply)
        guess = first_int(reply)
        if guess is None:
            return StepResult([{"role": "user", "content": "a number"}], 0.0, False, {})
        if guess == self.target:
            return StepResult([], 1.0, True, {"success": True})
        hint = "higher" if guess < self.target else "lower"
        return StepResult([{"role": "user", "content": hint}], 0.0, False, {})

    def _tool_step(self, reply: Reply) -> StepResult:
        called = self.run_tools(reply)  # (a tool may run in another process: its reply says)
        if called is None:
            return StepResult([{"role": "user", "content": "call guess"}], 0.0, False, {})
        if any(m["content"] == "correct" for m in called.observation):
            return StepResult([], 1.0, True, {**called.info, "success": True})
        return called

    def demonstration(self, row: dict[str, Any], rng: random.Random) -> list[Message]:
        """An imperfect player: every guess is consistent with the feedback so far; it is
        the lowest number still possible (a linear search) half of the time and the
        midpoint otherwise, for at most ``max_turns`` guesses. It wins 65/128 = 50.8 % of
        the 1..16 games in 4 guesses (bisection: 93.75 %), and each choice matters: a first
        guess at the midpoint is worth 0.656 against 0.359 for the lowest number, so RL has
        a clear move to prefer, one the model has seen."""
        messages = self.reset(row)
        low, high = 1, self.high
        for turn in range(self.max_turns):
            guess = (low + high) // 2 if rng.random() < 0.5 else low
            action = Reply(str(guess))
            if self.toolbox is None:
                messages.append({"role": "assistant", "content": action.text})
            else:  # the same guess as a call of the guess tool
                call = {"name": "guess", "arguments": {"number": guess}}
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
                action = _tool_reply(call)
            observation, _, done, _ = self.step(action)
            if done or turn == self.max_turns - 1:
                break
            messages += observation
            low, high = (guess + 1, high) if guess < self.target else (low, guess - 1)
        return messages


def calculate(expression: str) -> int:
    """Evaluate an integer expression with + - * and parentheses."""
    return _eval(ast.parse(str(expression), mode="eval").body)


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    raise ValueError(f"unsupported expression {ast.unparse(node)!r}")


@register_env("calculator")
class Calculator(Environment):
    """Arithmetic word problems with a ``calculator`` tool (module docstring)."""

    def __init__(self, *, max_turns: int = 3, digits: int = 2, tool_timeout: float = 5.0) -> None:
        super().__init__(max_turns=max_turns)
        if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 6:
            raise ConfigError(f"agent.env_args.digits must be an int in [1, 6], got {digits!r}")
        self.toolbox = ToolBox({"calculator": calculate}, timeout=tool_timeout)
        self.answer = 0

    @classmethod
    def rows(cls, count: int, seed: int, *, split: str, digits: int = 2, **_: Any) -> list[dict]:
        """``count`` problems ``a op b`` with ``digits``-digit operands; ``eval`` problems
        come from another stream of the seed."""
        rng = random.Random(f"{seed}:{split}")
        out = []
        for _ in range(count):
            a, b = (rng.randint(0, 10**digits - 1) for _ in range(2))
            op = rng.choice(list(_WORDS))
            out.append(
                {"question": f"what is {a} {_WORDS[op]} {b}?", "answer": calculate(f"{a}{op}{b}")}
            )
        return out

    def reset(self, row: dict[str, Any]) -> list[Message]:
        self.answer = int(row["answer"])
        return [{"role": "user", "content": str(row["question"])}]

    def step(self, reply: Reply) -> StepResult:
        tools = self.run_tools(reply)
        if tools is not None:
            return tools
        correct = first_int(reply) == self.answer
        return StepResult([], float(correct), True, {"success": correct})

    def demonstration(self, row: dict[str, Any], rng: random.Random) -> list[Message]:
        """Call the calculator on the question's expression, then answer its result."""
        messages = self.reset(row)
        a, word, b = str(row["question"]).removeprefix("what is ").removesuffix("?").split()
        symbol = {w: s for s, w in _WORDS.items()}[word]
        call = {"name": "calculator", "arguments": {"expression": f"{a}{symbol}{b}"}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages += self.run_tools(_tool_reply(call)).observation
        messages.append({"role": "assistant", "content": str(self.answer)})
        return messages


def _tool_reply(call: dict[str, Any]) -> Reply:
    """A scripted player's tool call as the reply a model writing it would give."""
    text = f"<tool_call>{json.dumps(call)}</tool_call>"
    return Reply(text, [ToolCall(call["name"], call["arguments"])], "")
