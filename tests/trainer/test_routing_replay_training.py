"""Routing replay (``algo.moe_routing_replay=true``) in a run: a tiny random Qwen3-MoE
saved with ``save_pretrained`` and trained through ``model.path``, online GRPO on the
in-process engine. Every rollout row carries the engine's routing of each of its tokens;
the policy forwards replay it; the router still trains. In float32 the first update's
policy is the engine's, so its own routing equals the replayed one (``changed`` 0) and the
behaviour log-probs are the trainer's within the float32 bound of
tests/rollout/test_hybrid_models.py. The options a replay cannot act on are errors that
name them."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
import transformers
from online_testing import record_rollouts

from ardea.config import load_config
from ardea.errors import ConfigError
from ardea.model import build_char_tokenizer
from ardea.trainer import Trainer

QUIET = ["trainer.eval_every=0", "logging.log_every=1", "logging.progress=false",
         "logging.tensorboard=false", "logging.report=false", "data.eval_size=4"]  # fmt: skip


def _saved_moe(directory):
    tokenizer = build_char_tokenizer(model_max_length=256)
    config = transformers.Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen3MoeForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_rollouts_carry_their_routing_and_the_policy_replays_it(tmp_path):
    model = _saved_moe(tmp_path / "model")
    run = tmp_path / "run"
    trainer = Trainer(load_config(None, [
        f"model.path={model}", "model.compute_dtype=float32", "algo.name=online_grpo",
        "algo.moe_routing_replay=true",
        'reward.functions=[{name: format_regex, kwargs: {pattern: "[0-4]"}}]',
        "rollout.max_new_tokens=6", "rollout.group_size=4", "trainer.batch_size=4",
        "trainer.max_steps=2", f"trainer.output_dir={run}", *QUIET,
    ]))  # fmt: skip
    router = trainer.policy.model.layers[0].mlp.gate.weight
    before = router.detach().clone()
    rollouts = record_rollouts(trainer)
    trainer.train()
    batch = rollouts[0].batch
    routes = batch.routed_experts  # (N, S, L, K): 2 MoE layers, 2 experts per token
    assert routes is not None and routes.shape == (*batch.input_ids.shape, 2, 2)
    real = batch.attention_mask.bool()
    last = real.sum(dim=-1) - 1  # the last token of a row never ran through the engine
    ran = real.clone()
    ran[torch.arange(batch.rows), last] = False
    assert bool((routes[ran] >= 0).all()) and bool((routes[~ran] == -1).all())
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "train/loss" in s]
    assert len(steps) == 2
    for step in steps:
        assert step["mismatch/abs_diff_max"] <= 1e-5
        # one update a step, on the weights the engine sampled with: the trainer's router
        # chooses as the engine's did but at a near-tie within float32 rounding (none in the
        # engine's test, tests/rollout/test_routing_record.py); a replay that misplaced the
        # routes (another row's, a shifted column) would change most of the ~400 choices
        assert step["moe/routing_replay_changed"] <= 0.01
    assert not torch.equal(router.detach(), before)  # the router's gate weights train


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["rollout.engine=vllm", "rollout.vllm.launch=true"], ["vllm", "V2 model runner"]),
        (["algo.name=sft"], ["algo.name=sft", "trains on data"]),
        ([], ["mixture-of-experts", "Qwen2ForCausalLM"]),
    ],
)
def test_routing_replay_where_it_cannot_act_is_an_error(tmp_path, overrides, words):
    args = ["algo.name=online_grpo", "algo.moe_routing_replay=true",
            f"trainer.output_dir={tmp_path}", *QUIET, *overrides]  # fmt: skip
    with pytest.raises(ConfigError) as error:
        Trainer(load_config(None, args))
    for word in words:
        assert word in str(error.value)
    assert "algo.moe_routing_replay" in str(error.value)


def test_background_rollouts_keep_their_routing_across_a_resume(tmp_path):
    """η = 1: the checkpoint of step 2 holds step 3's completions, made ahead; the resumed
    run trains on them with the routing they were generated with, as the whole run did."""
    model = _saved_moe(tmp_path / "model")
    args = [f"model.path={model}", "model.compute_dtype=float32", "algo.name=online_grpo",
            "algo.moe_routing_replay=true", "rollout.max_staleness=1",
            'reward.functions=[{name: format_regex, kwargs: {pattern: "[0-4]"}}]',
            "rollout.max_new_tokens=6", "rollout.group_size=4", "trainer.batch_size=4",
            "trainer.max_steps=3", "trainer.save_every=1", *QUIET]  # fmt: skip
    whole = Trainer(load_config(None, [*args, f"trainer.output_dir={tmp_path / 'whole'}"]))
    seen = record_rollouts(whole)
    whole.train()
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "whole", resumed_dir)
    shutil.rmtree(resumed_dir / "checkpoints" / "step_0000003")
    resumed = Trainer(load_config(None, [*args, f"trainer.output_dir={resumed_dir}",
                                         "trainer.resume=auto"]))  # fmt: skip
    again = record_rollouts(resumed)
    resumed.train()
    assert resumed.step == 3 and len(again) == 1  # step 3, from the checkpoint's completions
    routes, expected = again[0].batch.routed_experts, seen[2].batch.routed_experts
    assert routes is not None and torch.equal(routes, expected)


def test_an_engine_that_leaves_out_the_routing_fails_the_run(tmp_path):
    """A registered engine that ignores SamplingParams.routed_experts (here: the in-process
    engine with its recording taken out) would train without the replay: the run stops
    naming it."""
    from ardea.rollout import InProcessEngine

    class Forgetful(InProcessEngine):
        def generate(self, prompts, params):
            return [dataclasses.replace(c, routed_experts=None)
                    for c in super().generate(prompts, params)]  # fmt: skip

    model = _saved_moe(tmp_path / "model")
    trainer = Trainer(load_config(None, [
        f"model.path={model}", "model.compute_dtype=float32", "algo.name=online_grpo",
        "algo.moe_routing_replay=true", "rollout.max_new_tokens=4", "rollout.group_size=2",
        "trainer.batch_size=2", "trainer.max_steps=1", f"trainer.output_dir={tmp_path / 'run'}",
        *QUIET,
    ]))  # fmt: skip
    engine = trainer.service.runner.engine
    engine.__class__ = Forgetful
    with pytest.raises(ConfigError, match="Forgetful returned completions without the experts"):
        trainer.train()
