"""Tool-call parsers by name: each family's calls, written as its chat template renders an
assistant message with tool calls, parse back to the same names and arguments; malformed
calls are errors the model sees; ``auto`` finds the family from the template.

The templates below are minimal ones written for these tests: each renders an assistant
turn's tool calls in its family's documented format (Hermes/Qwen ``<tool_call>`` blocks,
Llama 3.1 JSON after ``<|python_tag|>``, Mistral ``[TOOL_CALLS]`` and its v11 form,
DeepSeek-V3's ``<｜tool▁call▁begin｜>`` blocks)."""

from __future__ import annotations

import copy

import pytest

from ardea.agent.tool_parsers import TOOL_PARSERS, detect_tool_parser, make_tool_parser
from ardea.errors import ConfigError

CALLS = [
    {"name": "weather", "arguments": {"city": "Paris", "days": 2}},
    {"name": "calculator", "arguments": {"expression": "17+25"}},
]
FAMILY_TEMPLATES = {
    "hermes": (
        "{% for m in messages %}{% if m.tool_calls %}{{ m.content or '' }}"
        "{% for c in m.tool_calls %}{{ '<tool_call>\\n' + ({'name': c.function.name, "
        "'arguments': c.function.arguments} | tojson) + '\\n</tool_call>' }}{% endfor %}"
        "{% endif %}{% endfor %}"
    ),
    "llama3_json": (
        "{# builtin tools answer after <|python_tag|> #}"
        "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
        "{{ ({'name': c.function.name, 'parameters': c.function.arguments} | tojson) }}"
        "{% if not loop.last %}{{ '; ' }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    ),
    "mistral": (
        "{% for m in messages %}{% if m.tool_calls %}{{ '[TOOL_CALLS][' }}"
        "{% for c in m.tool_calls %}{{ ({'name': c.function.name, 'arguments': "
        "c.function.arguments} | tojson) }}{% if not loop.last %}{{ ', ' }}{% endif %}"
        "{% endfor %}{{ ']' }}{% endif %}{% endfor %}"
    ),
    "deepseek_v3": (
        "{% for m in messages %}{% if m.tool_calls %}{{ m.content or '' }}"
        "{{ '<｜tool▁calls▁begin｜>' }}{% for c in m.tool_calls %}"
        "{{ '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + c.function.name + '\\n```json\\n' "
        "+ (c.function.arguments | tojson) + '\\n```<｜tool▁call▁end｜>' }}{% endfor %}"
        "{{ '<｜tool▁calls▁end｜>' }}{% endif %}{% endfor %}"
    ),
}


def rendered(tokenizer, family: str, content: str = "") -> str:
    """An assistant message with CALLS, as the family's template writes it."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = FAMILY_TEMPLATES[family]
    calls = [{"type": "function", "function": c} for c in CALLS]
    message = {"role": "assistant", "content": content, "tool_calls": calls}
    return tok.apply_chat_template([message], tokenize=False)


@pytest.mark.parametrize("family", sorted(FAMILY_TEMPLATES))
def test_each_family_round_trips_its_calls(tokenizer, family):
    content = "" if family in ("llama3_json", "mistral") else "Let me check. "
    text = rendered(tokenizer, family, content)
    calls, rest = make_tool_parser(family).parse(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        (c["name"], c["arguments"], None) for c in CALLS
    ]
    assert rest == content


def test_llama3_python_tag_and_plain_answers():
    parser = make_tool_parser("llama3_json")
    calls, rest = parser.parse('<|python_tag|>{"name": "f", "parameters": {"x": 1}}')
    assert [(c.name, c.arguments) for c in calls] == [("f", {"x": 1})] and rest == ""
    assert parser.parse("The answer is 42.") == ([], "The answer is 42.")
    assert parser.parse('{"result": 3}') == ([], '{"result": 3}')  # JSON, not a call


def test_mistral_v11_form():
    text = 'ok[TOOL_CALLS]weather[ARGS]{"city": "Paris"}[TOOL_CALLS]f[ARGS]{}'
    calls, rest = make_tool_parser("mistral").parse(text)
    assert [(c.name, c.arguments) for c in calls] == [("weather", {"city": "Paris"}), ("f", {})]
    assert rest == "ok"


@pytest.mark.parametrize(
    ("family", "text"),
    [
        ("hermes", "<tool_call>{not json}</tool_call>"),
        ("hermes", '<tool_call>{"name": "f", "arguments": {}}'),
        ("llama3_json", "<|python_tag|>{broken"),
        ("mistral", "[TOOL_CALLS][{broken"),
        ("mistral", "[TOOL_CALLS]f[ARGS]not json"),
        (
            "deepseek_v3",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{x\n```<｜tool▁call▁end｜>",
        ),
    ],
)
def test_malformed_calls_are_errors_not_crashes(family, text):
    calls, _ = make_tool_parser(family).parse(text)
    assert calls and all(c.error and "malformed" in c.error for c in calls)


def test_auto_detects_the_family_from_the_chat_template(tokenizer):
    tok = copy.deepcopy(tokenizer)
    for family, marker in (("hermes", "<tool_call>"), ("mistral", "[TOOL_CALLS]"),
                           ("llama3_json", "<|python_tag|>"),
                           ("deepseek_v3", "<｜tool▁calls▁begin｜>")):  # fmt: skip
        tok.chat_template = f"{{{{ '{marker}' }}}}"
        assert detect_tool_parser(tok) == family
        assert isinstance(make_tool_parser("auto", tok), TOOL_PARSERS[family])
    tok.chat_template = "{{ '<tool_call>' + '[TOOL_CALLS]' }}"
    with pytest.raises(ConfigError, match="name one of"):
        detect_tool_parser(tok)
    assert detect_tool_parser(tokenizer) == "hermes"  # ardea's tiny template


def test_unknown_names_are_errors_naming_the_choices():
    with pytest.raises(ConfigError, match="hermes, llama3_json, mistral, deepseek_v3"):
        make_tool_parser("qwen")
    with pytest.raises(ConfigError, match="cannot be imported"):
        make_tool_parser("no_such_module.Parser")
    with pytest.raises(ConfigError, match="not an ardea.agent.ToolParser"):
        make_tool_parser("json.JSONDecoder")


def test_the_recording_client_reads_calls_in_the_named_format(tokenizer):
    """A Mistral-format reply becomes message.tool_calls, its text before the marker the
    content; without an end marker, parallel_tool_calls=False cannot cut the tokens, so the
    reply keeps what was sampled."""
    from ardea.agent import RecordingClient

    from .agent_testing import ScriptedEngine

    text = 'ok[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]'
    engine = ScriptedEngine(tokenizer, [text, text])
    client = RecordingClient(engine, tokenizer, tool_parser="mistral")
    tool = {"type": "function", "function": {"name": "f"}}
    reply = client.chat.completions.create(
        messages=[{"role": "user", "content": "hi"}], tools=[tool]
    )
    message = reply.choices[0].message
    assert message.content == "ok" and [c.function.name for c in message.tool_calls] == ["f", "g"]
    assert reply.choices[0].finish_reason == "tool_calls"
    second = client.chat.completions.create(
        messages=[{"role": "user", "content": "hi"}], tools=[tool], parallel_tool_calls=False
    )
    assert len(second.choices[0].message.tool_calls) == 2
    assert client.interactions[1].output_ids == engine.outputs[1]


def test_agent_tool_parser_is_checked_with_the_config():
    from ardea.config import AgentConfig

    with pytest.raises(ConfigError, match="agent.tool_parser='qwen'"):
        AgentConfig(tool_parser="qwen")
    assert AgentConfig(tool_parser="mistral").tool_parser == "mistral"


def test_config_names_are_the_registered_parsers():
    from ardea.config.agent import TOOL_PARSER_NAMES

    assert TOOL_PARSER_NAMES == tuple(TOOL_PARSERS)
