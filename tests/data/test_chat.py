"""Chat and prompt-completion tokenization: assistant-only loss masks, checked against ids
spelled out by hand (character tokenizer: id = 6 + byte)."""

import pytest

from ardea.data import Record, tokenize_records
from ardea.errors import ArdeaError
from ardea.model import build_char_tokenizer

from .conftest import EOS, IM_END, IM_START, b


def turn(role, content):
    """ChatML ids of one message and its mask when only content + <|im_end|> are trained."""
    head = [IM_START, *b(role + "\n")]
    body = [*b(content), IM_END]
    trained = 1 if role == "assistant" else 0
    return head + body + b("\n"), [0] * len(head) + [trained] * len(body) + [0]


def expected(*messages):
    ids, mask = [], []
    for role, content in messages:
        i, m = turn(role, content)
        ids += i
        mask += m
    return ids, mask


def sft(tokenizer, data, *, max_length=256, chat_template=False):
    [sample] = tokenize_records(
        [Record(data, "d.jsonl", 7)],
        tokenizer,
        "sft",
        max_length=max_length,
        chat_template=chat_template,
    )
    assert len(sample.input_ids) == len(sample.loss_mask)
    return sample.input_ids, sample.loss_mask


def msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def test_three_message_conversation_trains_only_the_assistant_reply(tokenizer):
    conversation = [("system", "Be brief."), ("user", "2+2?"), ("assistant", "4")]
    ids, mask = sft(tokenizer, {"messages": msgs(*conversation)})
    want_ids = (
        [IM_START, *b("system\nBe brief."), IM_END, *b("\n")]
        + [IM_START, *b("user\n2+2?"), IM_END, *b("\n")]
        + [IM_START, *b("assistant\n"), *b("4"), IM_END, *b("\n")]
    )
    assert ids == want_ids
    trained = [i for i, m in zip(ids, mask) if m]
    assert trained == [*b("4"), IM_END]  # content + end of turn; no header, no trailing \n
    assert mask == [0] * (len(want_ids) - 3) + [1, 1, 0]


def test_multi_turn_with_tool_turn(tokenizer):
    conversation = [
        ("user", "hi"),
        ("assistant", "yo"),
        ("tool", "42"),
        ("user", "q"),
        ("assistant", "A!"),
    ]
    ids, mask = sft(tokenizer, {"messages": msgs(*conversation)})
    assert (ids, mask) == expected(*conversation)


def test_prompt_completion_raw_and_chat(tokenizer):
    record = {"prompt": "1+1=", "completion": "2"}
    assert sft(tokenizer, record) == (b("1+1=") + b("2") + [EOS], [0, 0, 0, 0, 1, 1])
    assert sft(tokenizer, record, chat_template=True) == expected(
        ("user", "1+1="), ("assistant", "2")
    )


def test_conversational_prompt_completion_trains_the_completion_only(tokenizer):
    prompt = [("system", "S"), ("user", "a"), ("assistant", "b"), ("user", "c")]
    record = {"prompt": msgs(*prompt), "completion": msgs(("assistant", "d"))}
    want_ids, want_mask = expected(*prompt, ("assistant", "d"))
    context = len(expected(*prompt)[0])
    want_mask = [0] * context + want_mask[context:]  # the prompt's assistant turn is context
    assert sft(tokenizer, record) == (want_ids, want_mask)  # message lists need no flag
    # a string completion after a message prompt becomes one assistant turn
    assert sft(tokenizer, {"prompt": msgs(*prompt), "completion": "d"}) == (want_ids, want_mask)


def test_template_without_special_end_marker_trains_everything_after_the_header():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    ids, mask = sft(tokenizer, {"messages": msgs(("user", "x"), ("assistant", "yz"))})
    assert ids == b("user: x\nassistant: yz\n")
    assert mask == [0] * len(b("user: x\nassistant: ")) + [1, 1, 1]


def test_template_that_rewrites_history_is_an_error():
    tokenizer = build_char_tokenizer()  # like templates that strip reasoning from past turns
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
        "{{ '<|im_start|>assistant\\n<|im_end|>\\n' }}{% else %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    conversation = msgs(("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"))
    with pytest.raises(ArdeaError, match=r"^d.jsonl line 7: chat template rewrites earlier turns"):
        sft(tokenizer, {"messages": conversation})


def test_chat_errors_are_one_line(tokenizer):
    cases = [
        ({"messages": msgs(("user", "a"))}, r"field 'messages' has no assistant message"),
        ({"messages": msgs(("assistant", "a"))}, r"messages\[0\] is an assistant turn"),
        ({"messages": []}, r"field 'messages' is an empty list"),
        ({"messages": [{"role": "user"}]}, r"missing field 'messages\[0\].content'"),
        ({"messages": [{"role": "user", "content": 3}]}, r"'messages\[0\].content' must be a str"),
        ({"messages": ["hi"]}, r"'messages\[0\]' must be a message object"),
        ({"messages": "hi"}, r"field 'messages' must be a list, got a string"),
        ({"prompt": 5, "completion": "x"}, r"'prompt' must be a string or a list of messages"),
        ({"prompt": "x"}, r"a 'sft' sample needs the fields \{'messages'\} or \{'prompt', 'comp"),
    ]
    for data, match in cases:
        with pytest.raises(ArdeaError, match=r"^d.jsonl line 7: .*" + match) as info:
            sft(tokenizer, data)
        assert "\n" not in str(info.value)


def test_a_tokenizer_without_chat_template_is_an_error():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ArdeaError, match="needs a chat template .* the tokenizer has none"):
        sft(tokenizer, {"messages": msgs(("user", "a"), ("assistant", "b"))})
    with pytest.raises(ArdeaError, match="needs a chat template"):
        sft(tokenizer, {"prompt": "a", "completion": "b"}, chat_template=True)


def test_too_long_is_an_error_naming_the_counts(tokenizer):
    conversation = {"messages": msgs(("user", "a" * 20), ("assistant", "b"))}
    n = len(expected(("user", "a" * 20), ("assistant", "b"))[0])
    assert len(sft(tokenizer, conversation, max_length=n)[0]) == n
    with pytest.raises(
        ArdeaError,
        match=rf"line 7: prompt \+ completion is {n} tokens, more than max_length={n - 1}",
    ):
        sft(tokenizer, conversation, max_length=n - 1)
    with pytest.raises(
        ArdeaError, match=r"line 7: the prompt alone is 30 tokens, more than max_length=10"
    ):
        sft(tokenizer, {"prompt": "x" * 30, "completion": "y"}, max_length=10)
