"""An LLM judge as a reward function: ``llm_judge`` asks a model behind an OpenAI-compatible
chat API (vLLM, ``ardea serve``, a hosted API) to grade each completion, and reads the grade
from its reply::

    reward:
      functions:
        - name: llm_judge
          kwargs:
            base_url: http://127.0.0.1:8000/v1
            model: judge
            template: "Question: {prompt}\\nReference: {answer}\\nAnswer: {completion}\\nGrade 0-10:"
            scale: 10

The prompt sent is ``template`` filled with ``{prompt}``, ``{completion}`` and every column of
the prompt record (``{answer}``, ``{reference}``, ...: a placeholder the record lacks is an
error naming it). The grade is the first match of ``pattern`` (by default the first number)
in the reply, divided by ``scale``. Requests go out ``concurrency`` at a time, greedy
(``temperature`` 0), at most ``max_tokens`` long, each with ``timeout_s`` and ``retries``
retries (the ``openai`` client's, with its backoff). A completion whose request still fails,
or whose reply holds no grade, gets ``None``: a failed score, left out of the baseline and
the loss under ``reward.on_error: mask`` and counted (``reward/llm_judge/failed_fraction``).
The API key is read from the environment variable ``api_key_env`` (none is needed by a
local server). What the judge cost is logged per batch as ``reward/llm_judge/requests``,
``reward/llm_judge/prompt_tokens`` and ``reward/llm_judge/completion_tokens`` (the server's
usage counts).

Set ``reward.timeout_s`` above what a batch can take (``len(batch) / concurrency`` rounds
of up to ``timeout_s * (retries + 1)`` each): past it the whole batch fails.
"""

from __future__ import annotations

import os
import re
import string
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ardea.errors import ConfigError
from ardea.reward.registry import register_reward
from ardea.reward.scored import ScoredValues

DEFAULT_TEMPLATE = (
    "Grade the answer to the question from 0 (wrong) to 10 (right). Reply with the grade "
    "only.\nQuestion: {prompt}\nAnswer: {completion}\nGrade:"
)
NUMBER = r"-?\d+(?:\.\d+)?"


def _check(**given: Any) -> None:
    """The options given to ``llm_judge`` (the registry has checked their names and that
    ``base_url`` and ``model`` are there); the defaults are the function's own."""
    base_url, model = given["base_url"], given["model"]
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"llm_judge: base_url={base_url!r} must be an http(s) URL")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"llm_judge: model={model!r} must name the judge's model")
    template = given.get("template", DEFAULT_TEMPLATE)
    fields = [name for _, name, _, _ in string.Formatter().parse(template) if name]
    if "completion" not in fields:
        raise ConfigError(f"llm_judge: template={template!r} has no {{completion}} to grade")
    pattern = given.get("pattern", NUMBER)
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"llm_judge: pattern={pattern!r} is not a regex: {exc}") from exc
    for name, low in (("max_tokens", 1), ("retries", 0), ("concurrency", 1)):
        value = given.get(name, low)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"llm_judge: {name}={value!r} must be an integer >= {low}")
    for name, positive in (("scale", True), ("timeout_s", True), ("temperature", False)):
        value = given.get(name, 1.0)
        bad = isinstance(value, bool) or not isinstance(value, int | float)
        if bad or value < 0 or (positive and value == 0):
            bound = "> 0" if positive else ">= 0"
            raise ConfigError(f"llm_judge: {name}={value!r} must be a number {bound}")


def _grade(reply: str, pattern: re.Pattern, scale: float) -> float | None:
    match = pattern.search(reply)
    if match is None:
        return None
    try:
        return float(match.group(1) if match.groups() else match.group(0)) / scale
    except ValueError:  # a pattern whose match is not a number
        return None


def _message(template: str, prompt: Any, completion: str, row: dict) -> str:
    question = (
        prompt if isinstance(prompt, str) else "\n".join(str(m.get("content", "")) for m in prompt)
    )
    fields = {**row, "prompt": question, "completion": completion}
    try:
        return template.format_map(fields)
    except KeyError as exc:
        raise ConfigError(
            f"llm_judge: the template's {{{exc.args[0]}}} is not a column of the prompt "
            f"record (it has {', '.join(sorted(row)) or 'no columns'})"
        ) from None


@register_reward("llm_judge", check=_check)
def llm_judge(
    prompts: list[Any],
    completions: list[str],
    rows: list[dict],
    *,
    base_url: str,
    model: str,
    template: str = DEFAULT_TEMPLATE,
    pattern: str = NUMBER,
    scale: float = 1.0,
    max_tokens: int = 16,
    temperature: float = 0.0,
    timeout_s: float = 30.0,
    retries: int = 2,
    concurrency: int = 8,
    api_key_env: str = "OPENAI_API_KEY",
) -> ScoredValues:
    """The judge's grade of each completion, or None where it gave none (module docstring)."""
    import openai  # here: a run without a judge never imports the client

    client = openai.OpenAI(
        base_url=base_url,
        api_key=os.environ.get(api_key_env) or "-",
        timeout=timeout_s,
        max_retries=retries,
    )
    regex = re.compile(pattern)
    messages = [_message(template, p, c, r) for p, c, r in zip(prompts, completions, rows)]

    def ask(text: str) -> tuple[float | None, Any]:
        try:
            reply = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": text}],
                max_tokens=max_tokens,
                temperature=temperature,
            )
        except openai.OpenAIError:  # after the client's retries: a failed score
            return None, None
        content = (reply.choices[0].message.content or "") if reply.choices else ""
        return _grade(content, regex, scale), reply.usage

    with client, ThreadPoolExecutor(concurrency, thread_name_prefix="ardea-judge") as pool:
        answers = list(pool.map(ask, messages))  # the client's connections closed after
    usage = [u for _, u in answers if u is not None]
    metrics = {
        "requests": float(len(messages)),
        "prompt_tokens": float(sum(u.prompt_tokens or 0 for u in usage)),
        "completion_tokens": float(sum(u.completion_tokens or 0 for u in usage)),
    }
    return ScoredValues([grade for grade, _ in answers], metrics=metrics)
