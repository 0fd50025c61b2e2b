"""Every example prompt of the README and the documentation pages is written the way the
model it is sent to was trained to read it. A model is known by the path a command names:
``runs/default`` is the default recipe's, ``runs/<name>`` the run of the shipped config whose
``trainer.run_name`` is ``name`` (``configs/`` and ``configs/gpu/``). Formats are not copied
here: a prompt is checked by rebuilding it with the model's task (its own prompt builder) or
against the chat data the model learnt from. (The Python snippets are not checked: the one
that sends a chat request, in serving.md, runs on the default checkpoint to show what a
recording holds, and says so.)"""

import json
import re
import shlex
from pathlib import Path

import pytest

from ardea.config import DEFAULT_RECIPE, load_config, stage_configs
from ardea.data import make_task
from ardea.data.tasks.arithmetic import OPERATORS

REPO = Path(__file__).parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SAMPLE = REPO / "examples" / "data" / "gsm8k_mini.jsonl"
#: a fenced block of shell lines (bash) or of text shown as it is typed (text)
BLOCK = re.compile(r"^```(?:bash|text)\n(.*?)^```", re.S | re.M)
#: a chat request's user message in a page's example client code
CHAT_REQUEST = re.compile(r'"role": "user", "content": "([^"]*)"')
#: where a page names a model it serves, in a block or in running text
SERVED = re.compile(r"ardea serve ([^\s`]+)")


def run_configs() -> dict[str, Path]:
    """Run name -> the shipped config that trains it."""
    found = {"default": DEFAULT_RECIPE}
    for path in sorted((REPO / "configs").glob("*.yaml")) + sorted(
        (REPO / "configs" / "gpu").glob("*.yaml")
    ):
        found[load_config(path).trainer.run_name] = path
    return found


RUNS = run_configs()


def model_config(path: str):
    """The config (the stage the path names, else the last) of the run ``path`` is in."""
    parts = Path(path).parts
    if len(parts) < 2 or parts[0] != "runs" or parts[1] not in RUNS:
        return None
    config = load_config(RUNS[parts[1]])
    stages = dict(stage_configs(config)) if config.stages else {}
    named = [stages[p] for p in parts[2:3] if p in stages]
    return named[0] if named else (list(stages.values())[-1] if stages else config)


def commands() -> list[tuple[str, list[str]]]:
    """(page, argv) of every ``ardea generate`` / ``ardea eval`` line of the pages' blocks."""
    out = []
    for page in PAGES:
        for block in BLOCK.findall(page.read_text(encoding="utf-8")):
            for line in block.splitlines():
                line = re.sub(r"^([A-Z][A-Z0-9_]*=\S+\s+)*", "", line.strip())  # env first
                if re.match(r"ardea (generate|eval) ", line):
                    out.append((page.name, shlex.split(line, comments=True)[1:]))
    return out


def values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == option]


def arithmetic_problem(task, prompt: str) -> tuple[int, str, int] | None:
    """``(a, op, b)`` whose prompt the task writes as ``prompt``, else None: the prompt's
    numbers read forwards and backwards, kept when the task's builder gives it back."""
    for op in task.ops:
        left, _, right = prompt.removesuffix("=").partition(op)
        readings = [{int(s), int(s[::-1])} if s.isdigit() else set() for s in (left, right)]
        for a in readings[0]:
            for b in readings[1]:
                if task.prompt(a, op, b) == prompt:
                    return a, op, b
    return None


def check_task_prompt(config, prompt: str, answer: str | None, where: str) -> None:
    """``prompt`` (and its reference ``answer``) as the task of ``config`` writes them."""
    data = config.data
    if data.task == "arithmetic":
        task = make_task("arithmetic", **data.task_args)
        problem = arithmetic_problem(task, prompt)
        assert problem is not None, f"{where}: {prompt!r} is not how the model's task writes sums"
        if answer is not None:
            a, op, b = problem
            assert answer == task.number(OPERATORS[op](a, b)), (where, prompt, answer)
    elif data.task == "math_jsonl":  # the sample's question in the task's own prompt
        task = make_task("math_jsonl", **{**data.task_args, "path": str(SAMPLE), "test_path": None})
        built = [e.prompt for e in task.examples("train", 54) + task.examples("test", 6)]
        words = prompt.split()
        assert any(p.split() == words for p in built), f"{where}: {prompt!r}"
    else:
        pytest.fail(f"{where}: no check for prompts of task {data.task!r} yet")


COMMANDS = commands()


@pytest.mark.parametrize(
    ("page", "argv"), COMMANDS, ids=[f"{page}: {' '.join(argv)[:60]}" for page, argv in COMMANDS]
)
def test_a_command_prompt_is_in_the_models_format(page, argv):
    config = model_config(argv[1])
    if config is None:
        assert not values(argv, "--prompt"), f"{page}: whose prompt format is {argv[1]}?"
        return
    chat = config.data.chat_template
    assert ("--chat" in argv) == chat, f"{page}: {argv[1]} was trained with chat_template={chat}"
    for prompt in values(argv, "--prompt"):
        check_task_prompt(config, prompt, None, page)
    for data in values(argv, "--data"):
        for line in (REPO / data).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            check_task_prompt(config, record["prompt"], str(record["answer"]), f"{page} {data}")


def shapes(text: str) -> str:
    return re.sub(r"\d+", "0", text)


def chat_requests() -> list[tuple[str, str, str]]:
    """(page, served path, user message) of every chat request shown in a text block,
    sent to the model the page served last before it."""
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in re.finditer(r"^```text\n(.*?)^```", text, re.S | re.M):
            served = SERVED.findall(text[: block.start()])
            for message in CHAT_REQUEST.findall(block.group(1)):
                out.append((page.name, served[-1] if served else "", message))
    return out


def test_the_docs_show_chat_requests():
    assert {page for page, _, _ in chat_requests()} >= {"README.md", "serving.md"}


@pytest.mark.parametrize(("page", "served", "message"), chat_requests())
def test_a_chat_request_goes_to_a_chat_model_in_its_format(page, served, message):
    config = model_config(served)
    assert config is not None, f"{page}: which model answers {message!r}?"
    if config.data.chat_template:  # a task's prompts as user turns
        check_task_prompt(config, message, None, page)
        return
    assert config.data.path, f"{page}: {served} learnt bare prompts, not chat turns"
    records = [json.loads(line) for line in (REPO / config.data.path).read_text().splitlines()]
    turns = {
        shapes(m["content"]) for r in records for m in r.get("messages", []) if m["role"] == "user"
    }
    assert shapes(message) in turns, f"{page}: {message!r} is unlike {config.data.path}'s turns"
