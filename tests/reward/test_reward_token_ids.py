"""Token ids for the reward functions that ask for them: declared by a keyword-only
``token_ids``, bound by make_reward, passed by the scorer (None where the caller has text
only), never to a function with the plain three-list signature."""

import sys
import textwrap

import pytest
from transformers import AutoTokenizer

from ardea.errors import ConfigError
from ardea.model import build_char_tokenizer
from ardea.reward import RewardError, RewardScorer, TokenIds, make_reward, takes_token_ids, vocab_id

PROMPTS, COMPLETIONS, ROWS = ["p0", "p1"], ["c0", "c1"], [{}, {}]
IDS = TokenIds([[1, 2], [3]], [[4, 5, 6], []], "vocab")


def by_length(prompts, completions, rows, *, token_ids=None):
    """The completion's id count, or its text's length without ids."""
    if token_ids is None:
        return [float(len(c)) for c in completions]
    return [float(len(c)) for c in token_ids.completions]


def plain(prompts, completions, rows):
    return [0.5] * len(completions)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "id_rewards.py").write_text(
        textwrap.dedent(
            """
            def first_id(prompts, completions, rows, *, token_ids, offset=0):
                return [c[0] + offset if c else None for c in token_ids.completions]

            def any_kwargs(prompts, completions, rows, **kwargs):
                return [float("token_ids" in kwargs)] * len(completions)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "id_rewards"
    sys.modules.pop("id_rewards", None)


def test_a_function_asks_for_ids_by_declaring_the_keyword(tmp_path):
    assert takes_token_ids(by_length)
    assert not takes_token_ids(plain)
    assert not takes_token_ids(lambda prompts, completions, rows, **kwargs: [])
    assert not takes_token_ids(lambda token_ids, completions, rows: [])  # the first list
    (tmp_path / "config.json").write_text("{}")  # binding checks the path, loads nothing
    assert takes_token_ids(make_reward("reward_model", path=str(tmp_path)))
    assert not takes_token_ids(make_reward("exact_match"))


def test_the_scorer_passes_ids_only_to_the_functions_that_ask(user_module):
    seen = []

    def record(prompts, completions, rows, *, token_ids=None):
        seen.append(token_ids)
        token_ids.completions[0].append(99)  # a call's own copy: changes reach no one else
        return [1.0] * len(completions)

    first_id = make_reward("id_rewards.first_id", offset=10)
    scorer = RewardScorer(
        [(by_length, 1.0), (plain, 1.0), (record, 0.0), (first_id, 1.0)], timeout_s=5.0
    )
    result = scorer.score(PROMPTS, COMPLETIONS, ROWS, token_ids=IDS)
    assert scorer.takes_ids == [True, False, True, True]
    assert result.per_function == {
        "by_length": [3.0, 0.0], "plain": [0.5, 0.5], "record": [1.0, 1.0],
        "first_id": [14.0, 0.0],
    }  # fmt: skip
    assert result.counts["reward/skipped"] == 1  # first_id has no id of an empty completion
    assert seen[0].prompts == IDS.prompts and seen[0].vocab == "vocab"
    assert IDS.completions == [[4, 5, 6], []]


def test_a_caller_with_text_only_passes_none_and_the_function_falls_back(user_module):
    scorer = RewardScorer([(by_length, 1.0)], timeout_s=5.0)
    assert scorer.score(PROMPTS, ["abcd", "a"], ROWS).rewards == [4.0, 1.0]
    needs = make_reward("id_rewards.first_id")  # declares token_ids and needs them
    scorer = RewardScorer([(needs, 1.0)], timeout_s=5.0, on_error="fail")
    with pytest.raises(RewardError, match=r"'first_id' raised AttributeError: 'NoneType'"):
        scorer.score(PROMPTS, COMPLETIONS, ROWS)  # the error names the function


def test_ids_reach_a_function_in_a_child_process():
    scorer = RewardScorer([(by_length, 1.0)], timeout_s=5.0, executor="process")
    assert scorer.score(PROMPTS, COMPLETIONS, ROWS, token_ids=IDS).rewards == [3.0, 0.0]


def test_ids_of_another_batch_size_are_refused():
    scorer = RewardScorer([(by_length, 1.0)], timeout_s=5.0)
    short = TokenIds([[1]], [[2]], "vocab")
    with pytest.raises(ValueError, match=r"ids of each of the 2 completions"):
        scorer.score(PROMPTS, COMPLETIONS, ROWS, token_ids=short)


def test_token_ids_is_not_an_option_and_plain_functions_are_unchanged(user_module):
    with pytest.raises(ConfigError, match=r"token_ids is passed by the scorer"):
        make_reward("id_rewards.first_id", token_ids=IDS)
    with pytest.raises(ConfigError, match=r"unknown argument\(s\) scale.*allowed: offset"):
        make_reward("id_rewards.first_id", scale=2)
    any_kwargs = make_reward("id_rewards.any_kwargs")
    assert not takes_token_ids(any_kwargs)
    scorer = RewardScorer([(any_kwargs, 1.0)], timeout_s=5.0)
    assert scorer.score(PROMPTS, COMPLETIONS, ROWS, token_ids=IDS).rewards == [0.0, 0.0]


def test_vocab_id_tells_vocabularies_apart(tmp_path):
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    assert vocab_id(AutoTokenizer.from_pretrained(tmp_path)) == vocab_id(tokenizer)
    tokenizer.add_tokens(["<think>"])
    assert vocab_id(tokenizer) != vocab_id(build_char_tokenizer())
