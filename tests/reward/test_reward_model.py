"""The reward_model function: a sequence-classification checkpoint (saved by plain
transformers) scores prompt + completion; batched scores equal one text at a time; with the
policy's tokenizer it scores the rollout's own token ids, with another one the re-rendered
text.

Tolerance 1e-5: the same float32 forward of a text alone or right-padded in a batch of
others differs by rounding only (padding changes matmul shapes: ~1e-7 per op, 2 layers)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from ardea.errors import ConfigError
from ardea.model import build_char_tokenizer, tiny_config
from ardea.reward import TokenIds, make_reward, vocab_id


def save_rm(tmp_path, num_labels=1, context=256):
    tokenizer = build_char_tokenizer()
    config = tiny_config(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                         max_position_embeddings=context)  # fmt: skip
    config.num_labels = num_labels
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    path = tmp_path / f"rm{num_labels}"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), model.eval(), tokenizer


def test_scores_are_the_models_logit_of_prompt_plus_completion(tmp_path):
    path, model, tokenizer = save_rm(tmp_path)
    prompts = ["12+34=", "7+8=", "100+1="]
    completions = ["46", "15 and more text", ""]
    score = make_reward("reward_model", path=path, batch_size=2)
    got = score(prompts, completions, [{}] * 3)
    alone = []
    for p, c in zip(prompts, completions):
        text = p + c + tokenizer.eos_token  # what reward_model trains on ends with eos
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            alone.append(float(model(input_ids=ids).logits[0, 0]))
    torch.testing.assert_close(torch.tensor(got), torch.tensor(alone), atol=1e-5, rtol=0)
    assert len(set(got)) == 3  # different texts, different scores


def test_a_text_longer_than_the_context_is_scored_on_its_end(tmp_path):
    """A reward model reads a text's last token (the completion's end): a text longer than
    its context (32 tokens here) is scored on its last 32 tokens, not its first."""
    path, model, tokenizer = save_rm(tmp_path, context=32)
    prompt, completion = "1234567890+" * 4, "the answer is 42"  # 44 + 16 + eos = 61 tokens
    (got,) = make_reward("reward_model", path=path)([prompt], [completion], [{}])
    ids = tokenizer(prompt + completion + tokenizer.eos_token, add_special_tokens=False)
    ids = torch.tensor([ids["input_ids"]])
    assert ids.shape[1] == 61
    with torch.no_grad():
        last, first = (float(model(input_ids=part).logits[0, 0]) for part in (ids[:, -32:], ids[:, :32]))  # fmt: skip
    assert got == pytest.approx(last, abs=1e-5)
    assert abs(last - first) > 1e-3  # the two ends score differently


def test_a_conversational_prompt_is_rendered_with_the_chat_template(tmp_path):
    path, model, tokenizer = save_rm(tmp_path)
    messages = [{"role": "user", "content": "2+2="}]
    got = make_reward("reward_model", path=path)([messages], ["4"], [{}])
    text = tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": "4"}], tokenize=False
    )
    assert text.endswith("<|im_end|>\n")
    text = text.removesuffix("\n")  # the reply's turn ends at its end-of-turn marker
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert got[0] == pytest.approx(float(model(input_ids=ids).logits[0, 0]), abs=1e-5)


def test_bad_options_and_models_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"path='/nowhere' is not a model directory"):
        make_reward("reward_model", path="/nowhere")
    path, _, _ = save_rm(tmp_path)
    with pytest.raises(ConfigError, match=r"batch_size=0 must be an integer >= 1"):
        make_reward("reward_model", path=path, batch_size=0)
    with pytest.raises(ConfigError, match=r"dtype='float16'; choose one of float32, bfloat16"):
        make_reward("reward_model", path=path, dtype="float16")
    two, _, _ = save_rm(tmp_path, num_labels=2)
    with pytest.raises(ConfigError, match=r"num_labels=2; a reward model gives one score"):
        make_reward("reward_model", path=two)(["a"], ["b"], [{}])


def _logit(model, ids):
    """The model's one logit at the last of ``ids`` (one sequence, a plain forward)."""
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


def _spelled(tokenizer, text):
    """``text`` one token per character (special-token strings spelled out, not merged)."""
    return [tokenizer(ch, add_special_tokens=False)["input_ids"][0] for ch in text]


def test_the_rollouts_own_ids_are_scored_not_a_retokenization_of_their_text(tmp_path):
    """A reward model with the policy's tokenizer scores ``prompt_ids + completion_ids`` as
    sampled. The completions here spell ``<eos>`` / ``<|im_end|>`` character by character:
    their decoded text re-tokenizes to the one special id, so re-rendering would score
    other tokens than the policy generated."""
    path, model, tokenizer = save_rm(tmp_path)
    policy = build_char_tokenizer()  # the policy's tokenizer: the same vocabulary
    eos, im_end = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")
    chat = [{"role": "user", "content": "2+2="}]
    prompts = ["12+34=", "7+8=", chat]
    prompt_ids = [
        tokenizer("12+34=", add_special_tokens=False)["input_ids"],
        tokenizer("7+8=", add_special_tokens=False)["input_ids"],
        tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False),
    ]
    prompt_ids[2] = tokenizer(prompt_ids[2], add_special_tokens=False)["input_ids"]
    completion_ids = [
        _spelled(tokenizer, "46<eos>") + [eos],  # stopped on eos: nothing appended
        _spelled(tokenizer, "15<eos>"),  # cut at the length limit: eos appended
        _spelled(tokenizer, "4<|im_end|>"),  # a chat reply cut short: its end-of-turn marker
    ]
    texts = [policy.decode(c, skip_special_tokens=True) for c in completion_ids]
    assert texts == ["46<eos>", "15<eos>", "4<|im_end|>"]
    expected = [
        prompt_ids[0] + completion_ids[0],
        prompt_ids[1] + completion_ids[1] + [eos],
        prompt_ids[2] + completion_ids[2] + [im_end],
    ]
    retokenized = [  # what re-rendering the decoded text scores instead
        tokenizer("12+34=46<eos>", add_special_tokens=False)["input_ids"],
        tokenizer("7+8=15<eos>", add_special_tokens=False)["input_ids"],
    ]
    assert retokenized[0] != expected[0] and retokenized[1] != expected[1]
    ids = TokenIds(prompt_ids, completion_ids, vocab_id(policy))
    score = make_reward("reward_model", path=path, batch_size=2)
    got = score(prompts, texts, [{}] * 3, token_ids=ids)
    want = [_logit(model, row) for row in expected]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=0)
    for value, other in zip(got, [_logit(model, row) for row in retokenized]):
        assert abs(value - other) > 1e-3
    assert score(prompts, texts, [{}] * 3) == pytest.approx(  # text only: re-rendered
        [*(_logit(model, row) for row in retokenized), score([chat], [texts[2]], [{}])[0]]
    )


def test_a_long_rollout_keeps_its_last_ids(tmp_path):
    path, model, tokenizer = save_rm(tmp_path, context=32)
    prompt_ids = _spelled(tokenizer, "1234567890+" * 4)
    completion_ids = _spelled(tokenizer, "the answer is 42") + [tokenizer.eos_token_id]
    ids = TokenIds([prompt_ids], [completion_ids], vocab_id(build_char_tokenizer()))
    (got,) = make_reward("reward_model", path=path)(["?"], ["?"], [{}], token_ids=ids)
    assert got == pytest.approx(_logit(model, (prompt_ids + completion_ids)[-32:]), abs=1e-5)


def test_a_reward_model_with_another_tokenizer_scores_the_re_rendered_text(tmp_path):
    """Another vocabulary (here one more token): the rollout's ids mean nothing to the
    reward model, so it re-renders the text with its own tokenizer."""
    tokenizer = build_char_tokenizer()
    tokenizer.add_tokens(["<think>"], special_tokens=True)
    config = tiny_config(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1)
    config.num_labels = 1
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    path = tmp_path / "other"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    policy = build_char_tokenizer()
    assert vocab_id(policy) != vocab_id(tokenizer)
    completion_ids = _spelled(policy, "46<eos>") + [policy.eos_token_id]
    prompt_ids = policy("12+34=", add_special_tokens=False)["input_ids"]
    ids = TokenIds([prompt_ids], [completion_ids], vocab_id(policy))
    (got,) = make_reward("reward_model", path=str(path))(
        ["12+34="], ["46<eos>"], [{}], token_ids=ids
    )
    text = tokenizer("12+34=46<eos>", add_special_tokens=False)["input_ids"]
    assert got == pytest.approx(_logit(model, text), abs=1e-5)
    assert abs(got - _logit(model, prompt_ids + completion_ids)) > 1e-3
