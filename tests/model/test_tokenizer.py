"""The character tokenizer: one id per byte, exact round trip, HF save/reload, chat."""

import json
import string
import unicodedata

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers.pre_tokenizers import ByteLevel
from transformers import AutoTokenizer, LlamaConfig, Qwen2Config

from ardea.model import build_char_tokenizer
from ardea.model.tokenizer import SPECIAL_TOKENS, byte_symbols

ASCII = string.digits + string.ascii_letters + string.punctuation + " \t\n"
ASCII_TEXT = st.text(alphabet=ASCII, max_size=80).filter(
    lambda text: not any(special in text for special in SPECIAL_TOKENS)
)
ANY_TEXT = st.text(max_size=40).filter(
    lambda text: not any(special in text for special in SPECIAL_TOKENS)
)
SAMPLES = [
    "347+589=936",
    "  two  leading spaces, two  inside and trailing  ",
    "line one\nline two\n\tindented ~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./",
    "<|im_start|>user\nhi<|im_end|>\n<eos>",
    "naïve café, 日本語, \x00\x7f",
]


def expected_ids(text: str) -> list[int]:
    """Independent reference: specials take ids 0-5, byte b of the UTF-8 text is 6 + b."""
    return [6 + byte for byte in text.encode("utf-8")]


def test_vocabulary_layout(tokenizer):
    assert len(tokenizer) == 262
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4, 5]
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<pad>", 0)
    assert (tokenizer.bos_token, tokenizer.bos_token_id) == ("<bos>", 1)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<eos>", 2)
    assert (tokenizer.unk_token, tokenizer.unk_token_id) == ("<unk>", 3)
    assert sorted(tokenizer.all_special_ids) == [0, 1, 2, 3, 4, 5]
    assert tokenizer.model_max_length == 256
    assert tokenizer.padding_side == "right"
    assert set(byte_symbols()) == set(ByteLevel.alphabet())  # the standard byte table
    for byte in range(128):
        assert tokenizer(chr(byte))["input_ids"] == [6 + byte]


@settings(max_examples=200, deadline=None)
@given(ASCII_TEXT)
def test_every_ascii_character_is_one_token_and_round_trips(text):
    tokenizer = build_char_tokenizer()
    ids = tokenizer(text)["input_ids"]
    assert ids == expected_ids(text)  # one id per character, no BOS/EOS added
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


@settings(max_examples=100, deadline=None)
@given(ANY_TEXT)
def test_any_unicode_text_is_bytes_and_round_trips_after_nfc(text):
    tokenizer = build_char_tokenizer()
    normalized = unicodedata.normalize("NFC", text)
    ids = tokenizer(text)["input_ids"]
    assert ids == expected_ids(normalized)
    assert tokenizer.decode(ids) == normalized


def test_special_strings_in_text(tokenizer):
    assert tokenizer("<eos>")["input_ids"] == [2]
    assert tokenizer("a<|im_end|>b")["input_ids"] == [6 + ord("a"), 5, 6 + ord("b")]
    ids = tokenizer("12<eos><pad>")["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "12"
    assert tokenizer.decode(ids) == "12<eos><pad>"


def test_batch_padding_is_right_with_pad_id(tokenizer):
    batch = tokenizer(["ab", "abcd"], padding=True, return_tensors="pt")
    a, b = 6 + ord("a"), 6 + ord("b")
    assert torch.equal(batch["input_ids"][0], torch.tensor([a, b, 0, 0]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]))


def test_chat_template(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "12+30="},
        {"role": "assistant", "content": "42"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n12+30=<|im_end|>\n"
        "<|im_start|>assistant\n42<|im_end|>\n"
    )
    prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n12+30=<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(messages[1:2], tokenize=True, return_dict=False)
    ids = ids["input_ids"] if isinstance(ids, dict) else ids
    assert list(ids) == [4, *expected_ids("user\n12+30="), 5, *expected_ids("\n")]


@pytest.mark.parametrize("model_config", [None, Qwen2Config(), LlamaConfig()])
def test_save_and_plain_autotokenizer_reload_is_identical(tokenizer, tmp_path, model_config):
    # With a qwen2 config.json next to it, transformers rebuilds the tokenizer as
    # Qwen2Tokenizer (byte-level BPE); it must still give identical ids and text.
    if model_config is not None:
        model_config.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "auto_map" not in config  # nothing of ardea is needed to load it
    reloaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    for text in SAMPLES:
        ids = tokenizer(text)["input_ids"]
        assert reloaded(text)["input_ids"] == ids
        assert reloaded.decode(ids) == tokenizer.decode(ids)
        assert reloaded.decode(ids, skip_special_tokens=True) == tokenizer.decode(
            ids, skip_special_tokens=True
        )
    assert reloaded.chat_template == tokenizer.chat_template
    messages = [{"role": "user", "content": "1+1="}]
    assert reloaded.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert len(reloaded) == len(tokenizer)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id"):
        assert getattr(reloaded, name) == getattr(tokenizer, name)
    assert sorted(reloaded.all_special_ids) == sorted(tokenizer.all_special_ids)
    assert reloaded.model_max_length == tokenizer.model_max_length
    assert reloaded.padding_side == "right"


def test_model_max_length_is_validated():
    assert build_char_tokenizer(model_max_length=512).model_max_length == 512
    with pytest.raises(ValueError, match="model_max_length"):
        build_char_tokenizer(model_max_length=0)
