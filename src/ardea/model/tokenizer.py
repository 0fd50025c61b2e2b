"""A character-level tokenizer for ardea's built-in tasks, as a Hugging Face tokenizer.

It is byte-level with no merges: every UTF-8 byte of the text is exactly one token, so each
ASCII character (printable, space, ``\t``, ``\n``, ...) is one token and
``decode(encode(text)) == text`` for any NFC-normalised text (all ASCII text included,
spaces and all). The vocabulary (262 ids) is:

    0 <pad>   1 <bos>   2 <eos>   3 <unk>   4 <|im_start|>   5 <|im_end|>
    6 + b     the byte b (0..255); e.g. "\n" = 16, " " = 38, "0" = 54, "A" = 71, "a" = 103

Special-token strings that occur in the text (``"<eos>"``, ``"<|im_end|>"``, ...) encode to
their one special id, as with any HF tokenizer. ``<unk>`` exists but is never produced.

Why byte-level rather than a bare character vocabulary: ``transformers`` 5 loads the
tokenizer of any ``qwen2`` model directory as ``Qwen2Tokenizer``, which rebuilds the backend
as a byte-level BPE (NFC normaliser, ByteLevel pre-tokenizer and decoder) from the saved
vocabulary. This tokenizer *is* such a BPE, so a checkpoint directory reloads with plain
``AutoTokenizer.from_pretrained`` to identical ids and text, whatever the model family.

Decisions a caller must know:

- No token is added automatically: ``tokenizer(text)`` returns exactly one id per byte
  (``add_bos_token = add_eos_token = False``). Task code appends ``<eos>`` to targets and
  adds ``<bos>`` itself if it wants one.
- The chat template is ChatML: each message is ``<|im_start|>{role}\n{content}<|im_end|>\n``;
  ``add_generation_prompt=True`` appends ``<|im_start|>assistant\n``. It supports tools
  (``apply_chat_template(..., tools=[...])``): a ``system`` turn lists them, calls are
  ``<tool_call>{json}</tool_call>``, results are ``tool`` turns (see ``CHAT_TEMPLATE``). An assistant turn
  therefore ends with ``<|im_end|>``, which is why the tiny model stops on ``<eos>`` *and*
  ``<|im_end|>`` (see :mod:`ardea.model.tiny`).
- Padding is on the right with ``<pad>`` (id 0), matching the ``[N, S]`` right-padded
  trajectory layout.
- ``save_pretrained(dir)`` writes ``tokenizer.json``, ``tokenizer_config.json`` and
  ``chat_template.jinja``; nothing of ardea is needed to load them.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"

SPECIAL_TOKENS: tuple[str, ...] = (
    PAD_TOKEN,
    BOS_TOKEN,
    EOS_TOKEN,
    UNK_TOKEN,
    IM_START_TOKEN,
    IM_END_TOKEN,
)
BYTE_OFFSET = len(SPECIAL_TOKENS)  # byte b has id BYTE_OFFSET + b

# ChatML. Jinja string literals carry the newlines so no template whitespace leaks in.
# With ``tools=`` a short system turn lists each tool as ``name(arg, ...)`` and the call
# format (Hermes/Qwen style); an assistant message's ``tool_calls`` render as one
# ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` each after its content, and
# tool results are ``tool`` turns. Kept short: every character is a token of the tiny model.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\ntools: ' }}"
    "{% for tool in tools %}{% set f = tool['function'] if 'function' in tool else tool %}"
    "{{ f['name'] + '(' + (f.get('parameters', {}).get('properties', {}) | list | join(', '))"
    " + ')' }}{% if not loop.last %}{{ ', ' }}{% endif %}{% endfor %}"
    '{{ \'. call: <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\\n\' }}'
    "{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set f = call['function'] if 'function' in call else call %}"
    "{% set args = f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) %}"
    "{{ '<tool_call>{\"name\": ' + (f['name'] | tojson) + ', \"arguments\": ' + args"
    " + '}</tool_call>' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def byte_symbols() -> list[str]:
    """The printable stand-in of each byte 0..255 used by byte-level BPE (GPT-2's table):
    bytes that are visible Latin-1 characters stand for themselves, the other 68 (space,
    control characters, ...) map in order to U+0100, U+0101, ... (space -> U+0120 "Ġ")."""
    visible = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols, shifted = {}, 0
    for byte in range(256):
        if byte in visible:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + shifted)
            shifted += 1
    return [symbols[byte] for byte in range(256)]


def _backend_tokenizer() -> Tokenizer:
    """The ``tokenizers`` object: byte-level BPE without merges (one id per byte), special
    tokens matched as whole strings before normalisation."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({symbol: BYTE_OFFSET + byte for byte, symbol in enumerate(byte_symbols())})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    return backend


def build_char_tokenizer(*, model_max_length: int = 256) -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer described in this module's docstring.

    Args:
        model_max_length: the longest sequence (in tokens = bytes) the tokenizer
            reports; matches the tiny model's default ``max_position_embeddings``.

    Returns:
        A ``PreTrainedTokenizerFast`` (262 ids) with pad/bos/eos/unk set, ``<|im_start|>`` and
        ``<|im_end|>`` as extra special tokens, right padding and a ChatML chat template.
    """
    if model_max_length < 1:
        raise ValueError(f"model_max_length must be >= 1, got {model_max_length}")
    return PreTrainedTokenizerFast(
        tokenizer_object=_backend_tokenizer(),
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        extra_special_tokens=[IM_START_TOKEN, IM_END_TOKEN],
        add_bos_token=False,
        add_eos_token=False,
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )
