"""The online strategies' wiring, through real training steps: what the config names reaches
the loss with the value computed here by hand.

Each test would fail if its feature were switched off inside the strategy while the
algorithm functions stayed correct: refilled groups in dynamic sampling, decoupled PPO's
proximal policy and behaviour weight, clip-higher and dual-clip, the advantage estimator,
the rollout temperature in the trainer's log-probs, the KL loss term, the overlong penalty.

The ratio tests hold the PPO ratio at a known value: the engine's behaviour log-probs equal
the trainer's within 1e-5 (fp32), so lowering them by ``δ`` on every generated token makes
``π / π_behav = e^δ`` on every trained token of the first update.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
from online_testing import (
    RUN,
    completion_lengths,
    group_advantages,
    metrics,
    naive_token_logprobs,
    record_rollouts,
)

from ardea.config import load_config
from ardea.trainer import Trainer

ONE_STEP = [*RUN, "trainer.max_steps=1"]


def trainer_for(tmp_path, *overrides: str) -> Trainer:
    return Trainer(load_config(None, [*ONE_STEP, *overrides, f"trainer.output_dir={tmp_path}"]))


def one_step(trainer: Trainer) -> dict[str, float]:
    """One training step as the loop runs it."""
    out = trainer.train_step()
    trainer.step += 1
    return out


def lower_behaviour_logprobs(trainer: Trainer, delta: float) -> list:
    """Every rollout's behaviour log-probs lowered by ``delta`` on its generated tokens."""
    return record_rollouts(
        trainer, lambda b: replace(b, logprobs=b.logprobs - delta * b.loss_mask.float())
    )


def surrogate(advantage: float, ratio: float, low: float, high: float, c=None) -> float:
    """PPO's per-token loss by hand: ``max(-A r, -A clip(r))``, dual-clipped at ``-A c``."""
    clipped = min(max(ratio, 1 - low), 1 + high)
    loss = max(-advantage * ratio, -advantage * clipped)
    if c is not None and advantage < 0:
        loss = min(loss, -advantage * c)
    return loss


def token_mean(per_row: list[float], lengths: list[int]) -> float:
    """``sum_i n_i l_i / sum_i n_i``: a per-row loss broadcast over each row's tokens."""
    return sum(n * x for n, x in zip(lengths, per_row)) / sum(lengths)


# --------------------------------------------------------------------- dynamic sampling
SPREAD_REWARD = '''
CALLS = []


def divisible_by_three(prompts, completions, rows):
    """Groups of two: prompts a+b= with 3 | a+b score [1, 0] (a spread), others [0, 0]."""
    CALLS.append(list(prompts))
    out = []
    for i, prompt in enumerate(prompts):
        a, b = prompt.rstrip("=").split("+")
        out.append(float((int(a) + int(b)) % 3 == 0 and i % 2 == 0))
    return out
'''


def has_spread(prompt: str) -> bool:
    a, b = prompt.rstrip("=").split("+")
    return (int(a) + int(b)) % 3 == 0


def trained_prompts(tokenizer, batch, group_size: int) -> list[str]:
    """The prompt of each group of a loss batch, in row order (rows of a group adjacent)."""
    prompts = []
    for ids, attn, loss in zip(batch.input_ids, batch.attention_mask, batch.loss_mask):
        prompt = ids[(attn > 0) & ~loss]
        prompts.append(tokenizer.decode(prompt.tolist(), skip_special_tokens=True))
    groups = [prompts[i : i + group_size] for i in range(0, len(prompts), group_size)]
    assert all(len(set(g)) == 1 for g in groups), groups
    return [g[0] for g in groups]


def refill_size(missing: int, kept: int, generated: int, batch: int, cap: int) -> int:
    """Prompts of the next refill round, by hand: batches of B, ceil(missing / kept share)."""
    if kept == 0:
        return cap * batch
    return batch * max(1, min(cap, math.ceil(missing * generated / (kept * batch))))


@pytest.mark.parametrize("max_refill", [1, 3])
def test_dynamic_sampling_trains_the_first_groups_with_a_spread_in_generation_order(
    tmp_path, write_reward_module, max_refill
):
    """8 prompts per step, about one in three with a reward spread: the trained batch is
    exactly the first 8 such groups over the step's rounds (first round, then refills), the
    refill rounds are the ones needed and each has the size of the refill rule."""
    write_reward_module("spread_reward", SPREAD_REWARD)
    trainer = trainer_for(
        tmp_path,
        "reward.functions=[{name: spread_reward.divisible_by_three}]",
        "data.task_args={digits: 2, ops: '+'}",
        "algo.dynamic_sampling=true",
        "algo.dynamic_sampling_max_rounds=3",
        f"algo.dynamic_sampling_max_refill={max_refill}",
        "rollout.group_size=2",
        "trainer.max_steps=4",
    )
    import spread_reward

    trained = []
    loss = trainer.strategy.loss

    def recording(batch, counts):
        trained.append(trained_prompts(trainer.tokenizer, batch, group_size=2))
        return loss(batch, counts)

    trainer.strategy.loss = recording
    trainer.train()
    records = [r for r in metrics(tmp_path) if "rollout/refill_rounds" in r]
    assert len(records) == len(trained) == 4
    calls = [prompts[::2] for prompts in spread_reward.CALLS]  # one prompt per group
    refilled = 0
    for record, groups in zip(records, trained):
        rounds = int(record["rollout/refill_rounds"])
        step_calls, calls = calls[: 1 + rounds], calls[1 + rounds :]
        first = step_calls[0]
        assert len(first) == 8
        assert record["rollout/groups_kept"] == sum(map(has_spread, first)) / 8
        kept, generated = sum(map(has_spread, first)), 8
        for refill in step_calls[1:]:  # each refill round was needed and sized by the rule
            assert kept < 8
            assert len(refill) == refill_size(8 - kept, kept, generated, 8, max_refill)
            kept, generated = kept + sum(map(has_spread, refill)), generated + len(refill)
        assert kept >= 8 or rounds == 3  # it stopped when full or out of rounds
        expected = [p for call in step_calls for p in call if has_spread(p)][:8]
        assert groups == expected
        refilled += len(expected) > sum(map(has_spread, first))
    assert not calls  # every reward call belongs to a step
    assert refilled >= 2  # refilled groups were trained in several steps


NO_SPREAD_REWARD = '''
CALLS = []


def zero(prompts, completions, rows):
    """Every completion scores 0 (no group has a spread), and each call is recorded."""
    CALLS.append((list(prompts), list(completions)))
    return [0.0] * len(prompts)
'''


def test_a_refill_round_samples_afresh_a_prompt_drawn_again(tmp_path, write_reward_module):
    """One training prompt, so every refill round draws the same prompt into the same rows
    as the first round: each round samples with a seed of its own, so its completions are
    new ones (a round seeded as the first would get the same group back, again without a
    reward spread, and the refill would be wasted)."""
    write_reward_module("no_spread", NO_SPREAD_REWARD)
    trainer = trainer_for(
        tmp_path,
        "reward.functions=[{name: no_spread.zero}]",
        "data.train_size=1",
        "trainer.batch_size=1",
        "rollout.group_size=4",
        "algo.dynamic_sampling=true",
        "algo.dynamic_sampling_max_rounds=2",
    )
    import no_spread

    one_step(trainer)
    rounds = no_spread.CALLS
    assert len(rounds) == 3  # the first round and two refills, each of the one prompt
    assert all(prompts == rounds[0][0] for prompts, _ in rounds)
    completions = [tuple(c) for _, c in rounds]
    assert len(set(completions)) == 3, completions


def test_dynamic_sampling_run_resumes_to_the_same_weights(tmp_path, write_reward_module):
    """The refill sampler's position is part of the checkpoint: a run resumed at step 2 of 4
    refills from the same prompts and ends with the same weights, bit for bit."""
    from safetensors.torch import load_file

    write_reward_module("spread_reward", SPREAD_REWARD)
    common = [
        *RUN,
        "reward.functions=[{name: spread_reward.divisible_by_three}]",
        "data.task_args={digits: 2, ops: '+'}",
        "algo.dynamic_sampling=true",
        "rollout.group_size=2",
        "trainer.max_steps=4",
        "trainer.save_every=2",
        "trainer.keep_last=3",
    ]
    Trainer(load_config(None, [*common, f"trainer.output_dir={tmp_path / 'a'}"])).train()
    b = tmp_path / "b"
    first = Trainer(load_config(None, [*common, "trainer.max_steps=2", f"trainer.output_dir={b}"]))
    first.train()  # stops at step 2 with its checkpoint, as a killed run would have it
    resumed = load_config(None, [*common, f"trainer.output_dir={b}", "trainer.resume=auto"])
    trainer = Trainer(resumed)
    assert trainer.step == 2
    trainer.train()
    final = "checkpoints/step_0000004/policy/model.safetensors"
    wa, wb = load_file(tmp_path / "a" / final), load_file(b / final)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


# ----------------------------------------------------------------- known ratios
@pytest.mark.parametrize(
    ("options", "delta", "expect"),
    [
        # decoupled PPO: the ratio against the proximal policy is 1, the behaviour weight
        # pi_prox / pi_behav is e^delta on every token
        (["algo.policy_loss=decoupled_ppo"], 0.5, dict(weight=math.exp(0.5), ratio=1.0, drop=0.0)),
        # ... and a cap below e^0.5 drops every token (they stay in the token count)
        (
            ["algo.policy_loss=decoupled_ppo", "algo.ppo.behav_imp_weight_cap=1.5"],
            0.5,
            dict(weight=0.0, ratio=1.0, drop=1.0),
        ),
        # plain PPO against the behaviour log-probs: ratio e^0.25 = 1.284 is clipped at
        # 1 + 0.28 for positive advantages (clip-higher), not at 1 + 0.2
        (
            ["algo.policy_loss=ppo", "algo.ppo.eps_clip_higher=0.28"],
            0.25,
            dict(weight=1.0, ratio=math.exp(0.25)),
        ),
        # dual-clip: ratio e^1.2 = 3.32 on negative advantages is bounded at c = 3
        (
            ["algo.policy_loss=ppo", "algo.ppo.eps_clip_higher=0.28", "algo.ppo.c_clip=3.0"],
            1.2,
            dict(weight=1.0, ratio=math.exp(1.2), c=3.0),
        ),
    ],
    ids=["decoupled", "decoupled-capped", "clip-higher", "dual-clip"],
)
def test_policy_loss_of_a_step_at_a_known_ratio(tmp_path, reward_module, options, delta, expect):
    trainer = trainer_for(tmp_path, *options)
    rollouts = lower_behaviour_logprobs(trainer, delta)
    out = one_step(trainer)
    (rollout,) = rollouts
    rewards = rollout.batch.rewards.tolist()
    lengths = completion_lengths(rollout.batch).tolist()
    advantages = group_advantages(rewards, group_size=8)
    assert any(a > 0 for a in advantages) and any(a < 0 for a in advantages)
    high = 0.28 if "algo.ppo.eps_clip_higher=0.28" in options else 0.2
    per_row = [
        expect["weight"] * surrogate(a, expect["ratio"], 0.2, high, expect.get("c"))
        for a in advantages
    ]
    expected = token_mean(per_row, lengths)
    assert out["loss/policy"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    if "drop" in expect:
        assert out["loss/behav_imp_weight"] == pytest.approx(expect["weight"], rel=1e-4)
        assert out["loss/behav_drop_frac"] == expect["drop"]
    else:
        assert "loss/behav_imp_weight" not in out
    clipped = [float(a > 0 and expect["ratio"] > 1 + high) for a in advantages]
    assert out["loss/clip_frac"] == pytest.approx(token_mean(clipped, lengths), abs=1e-6)


def test_gspo_takes_the_sequence_ratio(tmp_path, reward_module):
    """algo.policy_loss=gspo: only the first generated token of each row has its behaviour
    log-prob lowered by 0.3, so PPO's token ratios are e^0.3 there and 1 elsewhere, while
    GSPO's sequence ratio is s_i = e^(0.3 / n_i) on every token of row i; with the paper's
    clip range [1 - 3e-4, 1 + 4e-4] and seq-mean-token-mean the loss is
    -mean_i A_i * (1 + 4e-4 if A_i > 0 else s_i)."""

    def lower_first(batch):
        first = batch.loss_mask & ~torch.roll(batch.loss_mask, 1, dims=1)  # (N, S)
        return replace(batch, logprobs=batch.logprobs - 0.3 * first.float())

    trainer = trainer_for(
        tmp_path,
        "algo.policy_loss=gspo",
        "algo.ppo.eps_clip=3e-4",
        "algo.ppo.eps_clip_higher=4e-4",
        "algo.ppo.loss_agg_mode=seq-mean-token-mean",
    )
    rollouts = record_rollouts(trainer, lower_first)
    out = one_step(trainer)
    lengths = completion_lengths(rollouts[0].batch).tolist()
    advantages = group_advantages(rollouts[0].batch.rewards.tolist(), group_size=8)
    per_row = [surrogate(a, math.exp(0.3 / n), 3e-4, 4e-4) for a, n in zip(advantages, lengths)]
    expected = sum(per_row) / len(per_row)
    assert out["loss/policy"] == pytest.approx(expected, rel=1e-4, abs=1e-6)


# ------------------------------------------------------------- advantage estimators
def centred(rewards: list[float], g: int) -> list[float]:
    means = [sum(rewards[i : i + g]) / g for i in range(0, len(rewards), g)]
    return [r - means[i // g] for i, r in enumerate(rewards)]


def token_whitened(per_row: list[float], lengths: list[int]) -> list[float]:
    """Whitened over tokens: each row's value counts once per token (population std)."""
    mean = token_mean(per_row, lengths)
    var = token_mean([(x - mean) ** 2 for x in per_row], lengths)
    return [(x - mean) / (math.sqrt(var) + 1e-8) for x in per_row]


def estimator_by_hand(name: str, rewards: list[float], lengths: list[int]) -> list[float]:
    """Per-row advantages of each critic-free estimator (G = 8, gamma = 1: every token of a
    row has the same return, its outcome reward)."""
    if name == "grpo":
        return group_advantages(rewards, 8)
    if name == "dr_grpo":
        return centred(rewards, 8)
    if name == "rloo":
        return [8 / 7 * x for x in centred(rewards, 8)]
    if name == "reinforce_pp":
        return token_whitened(rewards, lengths)
    return token_whitened(centred(rewards, 8), lengths)  # reinforce_pp_baseline


@pytest.mark.parametrize(
    ("estimator", "agg"),
    [
        ("grpo", "seq-mean-token-sum"),
        ("dr_grpo", "seq-mean-token-sum"),
        ("rloo", "seq-mean-token-sum"),
        ("reinforce_pp", "seq-mean-token-mean"),
        ("reinforce_pp_baseline", "seq-mean-token-mean"),
    ],
)
def test_the_configured_advantage_estimator_drives_the_loss(
    tmp_path, reward_module, estimator, agg
):
    """At ratio 1 the loss is ``-mean_i n_i A_i`` (seq-mean-token-sum) or ``-mean_i A_i``
    (seq-mean-token-mean), with each estimator's ``A_i`` computed here from the rollout's
    rewards and lengths. The aggregation is chosen so that the value is not 0: group-centred
    advantages sum to 0 over each group's rows, token-whitened ones over the batch's tokens."""
    trainer = trainer_for(
        tmp_path, f"algo.ppo.adv_estimator={estimator}", f"algo.ppo.loss_agg_mode={agg}"
    )
    rollouts = record_rollouts(trainer)
    out = one_step(trainer)
    (rollout,) = rollouts
    rewards = rollout.batch.rewards.tolist()
    lengths = completion_lengths(rollout.batch).tolist()
    advantages = estimator_by_hand(estimator, rewards, lengths)
    weights = lengths if agg == "seq-mean-token-sum" else [1] * len(lengths)
    expected = -sum(n * a for n, a in zip(weights, advantages)) / len(lengths)
    assert abs(expected) > 1e-3  # the case separates the estimators
    assert out["loss/policy"] == pytest.approx(expected, rel=1e-4, abs=1e-6)


# -------------------------------------------------------------------- temperature
@pytest.mark.parametrize("strategy", ["online_grpo", "online_ppo"])
@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_trainer_logprobs_use_the_rollout_temperature(
    tmp_path, reward_module, strategy, temperature
):
    """The first update of a step runs on the weights that generated the rollout, so the
    trainer's log-probs equal the engine's: ratio 1 (approx KL ~ 0, nothing clipped) at any
    temperature, which holds only if both sides divide the logits by the same T."""
    trainer = trainer_for(tmp_path, f"algo.name={strategy}", f"rollout.temperature={temperature}")
    out = one_step(trainer)
    assert out["loss/approx_kl"] < 1e-9
    assert out["loss/clip_frac"] == 0.0


# --------------------------------------------------------------------- KL loss term
@pytest.mark.parametrize(("estimator", "kl_ctl"), [("k1", 0.1), ("k3", 0.5)])
def test_kl_to_the_reference_is_a_loss_term_of_online_grpo(
    tmp_path, reward_module, estimator, kl_ctl
):
    """Second step (the policy has moved from the reference): ``train/kl`` is the token mean
    of the configured estimator between the policy and the frozen initial policy, computed
    here with a naive full-vocabulary forward, and the loss adds ``kl_ctl`` times it."""
    trainer = trainer_for(
        tmp_path,
        f"algo.ppo.kl_ctl={kl_ctl}",
        f"algo.ppo.kl_estimator={estimator}",
        "trainer.max_steps=2",
    )
    first = one_step(trainer)
    assert abs(first["train/kl"]) < 1e-7  # the policy starts as the reference
    rollouts = record_rollouts(trainer)
    policy = copy.deepcopy(trainer.policy)  # the weights the second step's loss sees
    out = one_step(trainer)
    batch = rollouts[0].batch
    mask = batch.loss_mask[:, 1:]  # (N, S - 1): tokens 1.. that were generated
    pi = naive_token_logprobs(policy, batch)[mask]
    ref = naive_token_logprobs(trainer.strategy.reference.model, batch)[mask]
    log_ratio = pi - ref
    per_token = log_ratio if estimator == "k1" else torch.exp(-log_ratio) - 1 + log_ratio
    assert out["train/kl"] == pytest.approx(float(per_token.mean()), rel=1e-3)
    assert out["train/kl"] > 1e-4
    added = out["train/loss"] - out["loss/policy"]
    assert added == pytest.approx(kl_ctl * out["train/kl"], rel=1e-4)


# ---------------------------------------------------------------- overlong penalty
def test_overlong_penalty_reaches_the_rewards_the_loss_sees(tmp_path, write_reward_module):
    """Constant reward 1, budget 8, buffer 4, penalty 0.5: a completion of L tokens gets
    ``1 + 0.5 * min(0, (4 - L) / 4)``."""
    write_reward_module("one_reward", "def one(p, c, r):\n    return [1.0 for _ in c]\n")
    trainer = trainer_for(
        tmp_path,
        "reward.functions=[{name: one_reward.one}]",
        "reward.overlong_buffer=4",
        "reward.overlong_penalty=0.5",
    )
    rewards = []
    loss = trainer.strategy.loss
    trainer.strategy.loss = lambda batch, counts: (
        rewards.append(batch.rewards) or loss(batch, counts)
    )
    rollouts = record_rollouts(trainer)
    out = one_step(trainer)
    lengths = completion_lengths(rollouts[0].batch).tolist()
    expected = [1 + 0.5 * min(0.0, (4 - n) / 4) for n in lengths]
    assert len(set(expected)) > 1  # lengths on both sides of the buffer
    torch.testing.assert_close(torch.cat(rewards).double(), torch.tensor(expected).double())
    assert out["rollout/overlong_penalty"] == pytest.approx(sum(expected) / len(expected) - 1)


# ------------------------------------------------------------ updates of a rollout
def test_mini_batches_keep_groups_whole_and_cover_every_row_once_per_epoch():
    from ardea.data import TrajectoryBatch
    from ardea.trainer.step.split import split_updates

    groups = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3])  # four groups of uneven size
    batch = TrajectoryBatch.from_tensors(
        torch.arange(16).reshape(8, 2),
        torch.ones(8, 2, dtype=torch.long),
        torch.ones(8, 2, dtype=torch.bool),
        group_ids=groups,
    )
    updates = split_updates(
        batch, epochs=2, mini_batches=2, micro_batches=2, generator=torch.Generator().manual_seed(0)
    )
    assert len(updates) == 4 and all(len(u) == 2 for u in updates)  # 2 epochs x 2 minis
    for epoch in (updates[:2], updates[2:]):
        rows = [r for update in epoch for part in update for r in part.input_ids[:, 0].tolist()]
        assert sorted(rows) == list(range(0, 16, 2))  # every row once per epoch
        for update in epoch:
            for part in update:
                ids = part.group_ids.tolist()
                assert all(ids.count(g) == int((groups == g).sum()) for g in set(ids))  # whole
                first = part.input_ids[:, 0]
                assert torch.equal(first, first.sort().values)  # batch order inside a part
    single = split_updates(
        batch, epochs=1, mini_batches=1, micro_batches=1, generator=torch.Generator()
    )
    assert torch.equal(single[0][0].input_ids, batch.input_ids)  # the rollout's own order


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["rollout.engine=sglang"],
            r"unknown generation engine rollout.engine='sglang'; known engines: in_process, vllm",
        ),
        (
            ["rollout.engine=vllm"],
            r"rollout.engine=vllm needs either rollout.vllm.urls .* or rollout.vllm.launch=true",
        ),
        (
            ["rollout.vllm.launch=true"],
            r"rollout.vllm.launch is set but rollout.engine='in_process'",
        ),
        (
            ["rollout.engine=vllm", "rollout.vllm.servers=2"],
            r"rollout.vllm.servers=2 starts servers only with rollout.vllm.launch=true",
        ),
        (
            [
                "rollout.engine=vllm",
                "rollout.vllm.launch=true",
                "rollout.vllm.weight_transport=nfs",
            ],
            r"rollout.vllm.weight_transport='nfs' is not allowed; choose one of: 'file', 'http'",
        ),
        (
            ["algo.policy_loss=ppo2"],
            r"algo.policy_loss: unknown policy loss 'ppo2'; known policy losses: cispo, "
            r"cross_entropy, decoupled_ppo, dro, gspo, importance_sampling, ppo",
        ),
        (
            ["algo.policy_loss=ppo", "algo.ppo.behav_imp_weight_cap=2.0"],
            r"algo.policy_loss='ppo' does not take algo.ppo.behav_imp_weight_cap=2.0; unset it",
        ),
        (
            ["algo.policy_loss=gspo", "algo.ppo.c_clip=3.0"],
            r"'gspo' does not take algo.ppo.c_clip=3.0; .* \(it takes eps_clip, eps_clip_higher\)",
        ),
        (
            ["algo.policy_loss=dro"],
            r"algo.policy_loss='dro' takes beta, which algo.ppo does not have",
        ),
        (
            ["algo.name=online_ppo", "algo.dynamic_sampling=true"],
            r"algo.dynamic_sampling=true is not supported by algo.name=online_ppo",
        ),
        (
            ["rollout.temperature=1e-5"],
            r"rollout.temperature=1e-05 is not allowed; use 0 \(greedy\) or a temperature >= 0.0001",
        ),
    ],
)
def test_a_config_that_cannot_run_is_refused_before_training(
    tmp_path, reward_module, overrides, message
):
    from ardea.errors import ConfigError
    from ardea.trainer import check_config

    with pytest.raises(ConfigError, match=message):
        config = load_config(None, [*ONE_STEP, *overrides, f"trainer.output_dir={tmp_path}"])
        check_config(config)
        Trainer(config)


def test_bfloat16_compute_trains_with_ratios_near_one(tmp_path, reward_module):
    """model.compute_dtype=bfloat16 (fp32 parameters): engine and trainer both compute in
    bf16 but with differently shaped matmuls, so the first update's ratio is 1 only up to
    bf16 rounding: approx KL above fp32's 1e-9 and still far below any clipping."""
    trainer = trainer_for(tmp_path, "model.compute_dtype=bfloat16", "trainer.max_steps=2")
    assert trainer.precision.compute == torch.bfloat16
    out = one_step(trainer)
    assert 1e-9 < out["loss/approx_kl"] < 1e-3
    assert out["loss/clip_frac"] < 0.01
    assert math.isfinite(one_step(trainer)["train/loss"])


def test_attention_kernel_reaches_the_training_forward(tmp_path, reward_module, monkeypatch):
    """model.attn_implementation=eager: the policy's loss and log-prob forwards run on the
    eager kernel, and the model is back on its own (sdpa) kernel between steps."""
    trainer = trainer_for(tmp_path, "model.attn_implementation=eager", "trainer.max_steps=2")
    seen = []
    loss = trainer.strategy.loss

    def spy(batch, counts):
        seen.append(trainer.policy.config._attn_implementation)
        return loss(batch, counts)

    monkeypatch.setattr(trainer.strategy, "loss", spy)
    one_step(trainer)
    assert seen and set(seen) == {"eager"}
    assert trainer.policy.config._attn_implementation == "sdpa"


def test_length_buckets_cut_where_padding_dominates():
    from ardea.trainer.step.split import length_buckets

    # 8 groups of 8 rows: seven end at EOS within 20 tokens, one runs to 73 tokens.
    # One forward: 64 x 73 = 4672 positions; cut before the long group: 56 x 20 + 8 x 73 =
    # 1704, a saving of 2968 >= max(512, 4672 / 4); no cut inside either part saves anything.
    groups = torch.arange(8)
    length = torch.tensor([20, 18, 73, 20, 15, 20, 19, 20])
    buckets = length_buckets(groups, length, torch.full((8,), 8))
    assert [sorted(b.tolist()) for b in buckets] == [[0, 1, 3, 4, 5, 6, 7], [2]]
    # two groups of 4 rows at 10 and 12 tokens: 96 positions, a cut saves 8 < 512
    assert [b.tolist() for b in length_buckets(torch.tensor([0, 1]), torch.tensor([10, 12]),
                                              torch.tensor([4, 4]))] == [[0, 1]]  # fmt: skip


def test_length_buckets_leave_the_update_unchanged(tmp_path, reward_module, monkeypatch):
    """The same step with every micro-batch cut into length buckets (thresholds 0) and
    without any cut accumulates the same gradient and loss: each forward is normalised by
    the step's counts, so only the summation order changes."""
    import ardea.trainer.step.split as split
    from ardea.trainer.step.updates import Updater

    extra = ("rollout.max_new_tokens=12", "trainer.max_steps=2")
    seen: dict[str, dict] = {}
    forward_backward = Updater._forward_backward

    def spy(self, micro_batches, update=0):
        metrics = forward_backward(self, micro_batches, update)
        seen[name] = {
            "forwards": len(micro_batches),
            "loss": metrics["train/loss"],
            "grads": [p.grad.clone() for p in self.components[0].parameters],
        }
        return metrics

    monkeypatch.setattr(Updater, "_forward_backward", spy)
    for name, threshold in (("cut", 0), ("whole", 10**9)):
        monkeypatch.setattr(split, "MIN_SAVED_TOKENS", threshold)
        monkeypatch.setattr(split, "MIN_SAVED_FRACTION", 0.0 if threshold == 0 else 1.0)
        one_step(trainer_for(tmp_path / name, *extra))
    assert seen["whole"]["forwards"] == 1 and seen["cut"]["forwards"] > 1
    assert seen["cut"]["loss"] == pytest.approx(seen["whole"]["loss"], abs=1e-6)
    for cut, whole in zip(seen["cut"]["grads"], seen["whole"]["grads"], strict=True):
        torch.testing.assert_close(cut, whole, rtol=1e-5, atol=1e-7)
