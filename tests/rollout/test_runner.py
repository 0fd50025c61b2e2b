"""The rollout runner: trajectory layout, behaviour log-probs equal to the trainer's,
per-call seeds, reward shaping and metrics."""

import hashlib
import io

import pytest
import torch
from runner_testing import EXAMPLES, TASK, TOKENIZER, make_runner, one, rollout

from ardea.data import Record, tokenize_records
from ardea.model import sequence_logprobs
from ardea.reward import ScoredValues
from ardea.rollout import sampling_seed


def test_trajectory_layout():
    runner, _ = make_runner()
    batch = rollout(runner, seed_index=0).batch
    n, s = batch.input_ids.shape
    assert n == 4 * 3
    assert batch.group_ids.tolist() == [g for g in range(4) for _ in range(3)]
    generated = batch.loss_mask
    assert torch.equal(batch.versions >= 0, generated)
    assert torch.equal(batch.turn_ids == 0, generated) and bool((batch.turn_ids >= -1).all())
    for row in range(n):
        prompt = len(TOKENIZER(EXAMPLES[row // 3].prompt)["input_ids"])
        count = int(generated[row].sum())
        assert not generated[row, :prompt].any()
        assert bool(generated[row, prompt : prompt + count].all())
        assert bool(batch.no_eos[row]) == (
            count == 6 and batch.input_ids[row, prompt + count - 1] != TOKENIZER.eos_token_id
        )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_the_trainers(temperature):
    """The engine's log-probs are those the trainer recomputes for the same tokens and
    weights at the same temperature (fp32, CPU): max abs difference <= 1e-5."""
    runner, policy = make_runner(temperature=temperature, max_new_tokens=8)
    batch = rollout(runner, seed_index=5).batch
    trainer = sequence_logprobs(
        policy, batch.input_ids, batch.attention_mask, temperature=temperature
    ).logprobs  # (N, S) next-token aligned
    mask, behaviour = batch.action_mask, batch.behaviour_logprobs
    assert batch.temperature == temperature
    assert int(mask.sum()) > 20
    assert float((trainer.detach() - behaviour)[mask].abs().max()) <= 1e-5


def test_seed_index_fixes_the_completions():
    runner, _ = make_runner()
    a = rollout(runner, seed_index=3).batch
    b = rollout(runner, seed_index=3).batch
    c = rollout(runner, seed_index=4).batch
    assert torch.equal(a.input_ids, b.input_ids)
    assert not torch.equal(a.input_ids, c.input_ids)
    assert len({sampling_seed(0, 3), sampling_seed(0, 4), sampling_seed(1, 3)}) == 3
    # a stable hash, the same in every process: the first 8 bytes of blake2b("0:3:7:1"), >> 1
    digest = hashlib.blake2b(b"0:3:7:1", digest_size=8).digest()
    assert sampling_seed(0, 3, 7, 1) == int.from_bytes(digest, "big") >> 1
    assert 0 <= sampling_seed(0, 3, 7, 1) < 2**63


def test_overlong_penalty_is_added_to_the_reward():
    runner, _ = make_runner(
        group_size=4, max_new_tokens=6, reward=one, overlong_buffer=3, overlong_penalty=0.5
    )
    scored = rollout(runner, seed_index=0)
    lengths = scored.batch.loss_mask.sum(dim=-1).tolist()
    assert max(lengths) > 3  # some completions reach into the buffer
    # by hand: no penalty up to 6 - 3 = 3 tokens, then 0.5 × (3 - n) / 3 per extra token
    penalty = {1: 0.0, 2: 0.0, 3: 0.0, 4: -1 / 6, 5: -1 / 3, 6: -0.5}
    for n, reward in zip(lengths, scored.batch.rewards.tolist()):
        assert reward == pytest.approx(1.0 + penalty[int(n)], abs=1e-6), (n, reward)
    assert scored.metrics["rollout/overlong_penalty"] < 0


def test_metrics_and_samples():
    runner, _ = make_runner(task=TASK)
    scored = rollout(runner, seed_index=0)
    rewards = scored.batch.rewards
    assert scored.metrics["rollout/reward_mean"] == pytest.approx(float(rewards.mean()))
    assert scored.metrics["rollout/reward_std"] == pytest.approx(float(rewards.std(unbiased=False)))
    assert scored.metrics["rollout/accuracy"] == 0.0  # an untrained model never adds up
    lengths = scored.batch.loss_mask.sum(dim=-1).float()
    assert scored.metrics["rollout/response_length"] == pytest.approx(float(lengths.mean()))
    generation = runner.generate(EXAMPLES, seed_index=0)
    tokens = sum(len(c.token_ids) for c in generation.completions)
    throughput = runner.score(generation).metrics["perf/generate_tokens_per_s"]
    assert throughput == pytest.approx(tokens / generation.seconds)
    assert [s[0] for s in scored.samples] == [e.prompt for e in EXAMPLES]


def test_overlong_buffer_beyond_the_budget_is_refused():
    with pytest.raises(ValueError, match="overlong_buffer=9 exceeds rollout.max_new_tokens=6"):
        make_runner(overlong_buffer=9)


def test_prompt_records_reach_the_reward_functions_with_their_columns():
    seen = []

    def bonus(prompts, completions, rows):
        seen.append((prompts, rows))
        return [float(row["bonus"]) for row in rows]

    chat = [{"role": "user", "content": "hi"}]
    data = [{"prompt": "1+2=", "answer": "3", "bonus": 0.5}, {"prompt": chat, "bonus": 2}]
    samples = tokenize_records([Record(d) for d in data], TOKENIZER, "prompt", max_length=32)
    runner, _ = make_runner(group_size=2, reward=bonus)
    batch = rollout(runner, samples, seed_index=0).batch
    [(prompts, rows)] = seen
    assert prompts == ["1+2=", "1+2=", chat, chat]  # as written in the records
    assert rows == [data[0], data[0], data[1], data[1]]  # every column, at the top level
    assert batch.rewards.tolist() == [0.5, 0.5, 2.0, 2.0]
    for row, sample in zip((0, 2), samples):  # the engine completed the records' own ids
        width = len(sample.prompt_ids)
        assert batch.input_ids[row, :width].tolist() == list(sample.prompt_ids)
        assert not batch.loss_mask[row, :width].any() and batch.loss_mask[row, width]


def test_reward_functions_that_ask_for_token_ids_get_the_rollouts_own():
    """A function declaring ``token_ids`` gets each completion's prompt ids and its ids as
    sampled (stop token included), with the policy tokenizer's vocabulary fingerprint; in the
    trainer's score() and in generate(score=True) alike."""
    from ardea.reward import vocab_id

    seen = []

    def ids_reward(prompts, completions, rows, *, token_ids=None):
        seen.append(token_ids)
        return [float(len(c)) for c in token_ids.completions]

    runner, _ = make_runner(reward=ids_reward, max_new_tokens=12)
    generation = runner.generate(EXAMPLES, seed_index=0)
    out = runner.score(generation)
    ahead = runner.generate(EXAMPLES, seed_index=0, score=True)
    completions = generation.completions
    assert any(c.finish_reason == "stop" for c in completions)  # some end on a stop token
    for got in seen:
        assert got.prompts == [c.prompt_ids for c in completions]
        assert got.completions == [c.token_ids for c in completions]
        assert got.vocab == vocab_id(TOKENIZER)
    assert len(seen) == 2 and ahead.scored.rewards == [len(c.token_ids) for c in completions]
    assert out.batch.rewards.tolist() == [len(c.token_ids) for c in completions]


def test_a_rollout_split_by_first_prompt_samples_what_one_call_does():
    """Ranks generate their shares of the step's prompts with ``first_prompt``: the shares'
    completions are the whole call's, row for row."""
    runner, _ = make_runner()
    whole = runner.generate(EXAMPLES, seed_index=5).completions
    split = [
        *runner.generate(EXAMPLES[:1], seed_index=5).completions,
        *runner.generate(EXAMPLES[1:], seed_index=5, first_prompt=1).completions,
    ]
    assert [c.token_ids for c in split] == [c.token_ids for c in whole]
    unshifted = runner.generate(EXAMPLES[1:], seed_index=5).completions
    assert [c.token_ids for c in unshifted] != [c.token_ids for c in whole[3:]]


def counted_length(prompts, completions, rows):
    """Each completion's length, and the batch's size as a total the scorer logs."""
    return ScoredValues([float(len(c)) for c in completions], metrics={"requests": len(rows)})


def test_shares_scored_apart_and_joined_collate_into_the_whole_rollout():
    """Under torchrun each rank scores its share where it generated it, sends it in its
    checkpoint form, and every rank joins the shares before collating: the rows, rewards,
    groups and metrics are one call's, and a reward function's batch totals add up."""
    runner, _ = make_runner(reward=counted_length)
    whole = runner.score(runner.generate(EXAMPLES, seed_index=5))
    first = runner.generate(EXAMPLES[:1], seed_index=5)
    rest = runner.generate(EXAMPLES[1:], seed_index=5, first_prompt=1)
    for part in (first, rest):
        runner.score_rewards(part)
    sent = runner.restore_generation(runner.generation_state(rest), EXAMPLES[1:])
    joined = runner.score(runner.join([first, sent]))
    for name in ("input_ids", "loss_mask", "rewards", "group_ids", "no_eos"):
        assert torch.equal(getattr(joined.batch, name), getattr(whole.batch, name)), name
    assert whole.metrics["reward/counted_length/requests"] == 12
    same = {k: v for k, v in whole.metrics.items() if not k.startswith("perf/")}
    assert {k: joined.metrics[k] for k in same} == same


def test_rollout_accuracy_reuses_the_task_rewards_scores():
    """With the task as the reward, each completion is scored once (not again for
    rollout/accuracy)."""
    from ardea.data.tasks.arithmetic import ArithmeticTask
    from ardea.reward import RewardScorer, task_reward

    class Counting(ArithmeticTask):
        calls = 0

        def score(self, completion, example):
            Counting.calls += 1
            return float(len(completion) % 2 == 0)  # a rule with both outcomes

    task = Counting(digits=2)
    runner, _ = make_runner(task=task)
    runner.scorer = RewardScorer([(task_reward(task), 1.0)], timeout_s=10.0)
    generation = runner.generate(EXAMPLES, seed_index=0)
    Counting.calls = 0
    scored = runner.score(generation)
    texts = [
        TOKENIZER.decode(c.token_ids, skip_special_tokens=True) for c in generation.completions
    ]
    assert Counting.calls == len(texts) == 12  # the scorer's calls only
    expected = [len(t) % 2 == 0 for t in texts]
    assert 0 < sum(expected) < len(expected)
    assert scored.metrics["rollout/accuracy"] == sum(expected) / len(expected)


SCORES = [1.0, 0.0, None, 1.0, float("nan"), 0.5, 0.0, 1.0, 2.0, None, None, None]


def scripted(prompts, completions, rows):
    """Fixed scores by position (4 groups of 3): None and NaN cannot be scored."""
    return list(SCORES)


@pytest.mark.parametrize("on_error", ["mask", "zero"])
def test_failed_scores_are_left_out_of_the_batch_and_its_baselines(on_error):
    """Groups (1, 0, None), (1, NaN, 0.5), (0, 1, 2), (None, None, None). Under mask the
    failed rows are not in the batch: GRPO's baselines by hand are group 0: [1, 0] → mean
    0.5, std 0.5 → ±1; group 1: [1, 0.5] → ±1; group 2: [0, 1, 2] → mean 1, std √(2/3) →
    ∓1.2247, 0; group 3 is gone. Under zero every row is trained, failures scored 0."""
    from ardea.algo import compute_advantages
    from ardea.config import PPOConfig

    runner, _ = make_runner(reward=scripted)
    runner.scorer.on_error = on_error
    out = rollout(runner)
    batch = out.batch
    assert out.metrics["reward/failed_fraction"] == 5 / 12
    assert out.metrics["reward/scripted/failed_fraction"] == 5 / 12
    assert (out.metrics["reward/skipped"], out.metrics["reward/nonfinite"]) == (4.0, 1.0)
    inputs = batch.advantage_inputs()
    adv = compute_advantages(inputs, PPOConfig(adv_estimator="grpo")).advantages
    per_row = adv.sum(-1) / inputs.mask.sum(-1)  # the same on every token of a row
    if on_error == "zero":
        assert batch.rows == 12 and batch.rewards.tolist()[:3] == [1.0, 0.0, 0.0]
        return
    assert batch.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 2]
    assert batch.rewards.tolist() == [1.0, 0.0, 1.0, 0.5, 0.0, 1.0, 2.0]
    s = (2 / 3) ** 0.5
    expected = [1.0, -1.0, 1.0, -1.0, -1 / s, 0.0, 1 / s]
    # float32: O(1) values through a mean, a std and a division, each off by <= 2^-24
    # relative, then averaged over a row's tokens: well under 1e-6
    torch.testing.assert_close(per_row, torch.tensor(expected), atol=1e-6, rtol=0)
    assert out.metrics["rollout/reward_mean"] == pytest.approx(5.5 / 7)
    assert [s[2] for s in out.samples] == [1.0, 1.0, 0.0]  # each group's first kept row


def test_a_rollout_whose_every_score_failed_stops_naming_the_function():
    from ardea.reward import RewardError

    runner, _ = make_runner(reward=lambda p, c, r: [None] * len(c))
    with pytest.raises(RewardError, match=r"every completion.*'<lambda>' returned None"):
        rollout(runner)


def test_scores_made_with_the_completions_are_kept_and_not_made_again():
    """generate(score=True) scores where it runs (a background worker); score() then only
    collates, and a checkpoint's copy of the generation keeps the scores, so a resumed run
    trains on the very rewards (a judge need not answer twice alike)."""
    calls = []

    def counted(prompts, completions, rows):
        calls.append(len(completions))
        return [float(len(c)) + 0.25 * len(calls) for c in completions]  # differs per call

    runner, _ = make_runner(reward=counted)
    ahead = runner.generate(EXAMPLES, seed_index=0, score=True)
    assert calls == [12] and ahead.scored is not None and ahead.scored.seconds > 0
    out = runner.score(ahead)
    assert calls == [12]  # not scored again
    lengths = [len(c.token_ids) for c in ahead.completions]
    texts = [
        runner.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in ahead.completions
    ]
    assert out.batch.rewards.tolist() == [len(t) + 0.25 for t in texts]
    assert out.metrics["perf/reward_s"] == ahead.scored.seconds
    buffer = io.BytesIO()
    torch.save(runner.generation_state(ahead), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    restored = runner.restore_generation(state, list(EXAMPLES))
    assert runner.score(restored).batch.rewards.tolist() == out.batch.rewards.tolist()
    assert calls == [12] and [len(c.token_ids) for c in restored.completions] == lengths
    plain = runner.generate(EXAMPLES, seed_index=0)  # the trainer's own: scored in score()
    assert plain.scored is None and calls == [12]
    assert runner.score(plain).batch.rewards.tolist() == [len(t) + 0.5 for t in texts]


def test_a_score_that_fails_ahead_under_fail_is_tried_again_by_the_trainer():
    """on_error=fail: a failure in the worker leaves the generation unscored (a checkpoint
    can hold it); score() tries once more and raises when the function fails again."""
    from ardea.reward import RewardError

    calls = []

    def down_once(prompts, completions, rows):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("judge unreachable")
        return [1.0] * len(completions)

    runner, _ = make_runner(reward=down_once)
    runner.scorer.on_error = "fail"
    ahead = runner.generate(EXAMPLES, seed_index=0, score=True)
    assert ahead.scored is None and len(calls) == 1
    assert runner.score(ahead).batch.rewards.tolist() == [1.0] * 12
    runner, _ = make_runner(reward=lambda p, c, r: 1 / 0)
    runner.scorer.on_error = "fail"
    ahead = runner.generate(EXAMPLES, seed_index=0, score=True)
    with pytest.raises(RewardError, match="ZeroDivisionError"):
        runner.score(ahead)
