"""Weights reach an engine only through update_weights: after one trained step a separate
engine generates exactly from the trained policy once the step is pushed to it."""

import pytest
import torch
from online_testing import RUN, naive_token_logprobs
from tiny_models import small_model

from ardea.config import load_config
from ardea.data import TrajectoryBatch
from ardea.model import build_char_tokenizer
from ardea.rollout import EngineSpec, SamplingParams, make_engine, own_copy
from ardea.trainer import Trainer


@pytest.mark.parametrize(
    "lora", [[], ["model.lora_r=4", "model.lora_alpha=32"]], ids=["full", "lora"]
)
def test_a_trained_step_pushed_to_a_separate_engine(lora, tmp_path, reward_module):
    """A LoRA policy pushes its adapters alone (the trainer gathers no frozen tensor), and
    the engine's copy then generates as the adapted policy."""
    trainer = Trainer(
        load_config(None, [*RUN, "trainer.max_steps=1", f"trainer.output_dir={tmp_path}", *lora])
    )
    spec = EngineSpec.of(trainer.policy, trainer.tokenizer)
    engine = make_engine("in_process", spec, module=own_copy(trainer.policy))
    trainer.train_step()  # one step of online GRPO at lr 1e-2 moves the policy
    prompts = [trainer.tokenizer("12+34=")["input_ids"], trainer.tokenizer("5+6=")["input_ids"]]
    params = SamplingParams(temperature=1.0, max_new_tokens=6, n=4, seed=3)

    def gap() -> float:
        """Largest |engine log-prob - trained policy's recomputed log-prob| on the engine's
        own completions (independent full forward in float64)."""
        completions = engine.generate(prompts, params)
        rows = [c.prompt_ids + c.token_ids for c in completions]
        width = max(map(len, rows))
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        recomputed = naive_token_logprobs(
            trainer.policy, TrajectoryBatch.from_tensors(ids, attn, attn.bool())
        )
        worst = 0.0
        for row, c in enumerate(completions):
            start = len(c.prompt_ids) - 1  # column t scores token t + 1
            mine = recomputed[row, start : start + len(c.token_ids)]
            worst = max(
                worst, float((mine - torch.tensor(c.logprobs, dtype=torch.float64)).abs().max())
            )
        return worst

    assert gap() > 1e-3  # the engine still holds the weights of before the step
    weights = trainer._gather_weights()
    if lora:
        assert weights and all("lora_" in name for name in weights)
        with pytest.raises(ValueError, match="missing"):  # an adapter tensor short
            engine.update_weights(dict(list(weights.items())[1:]), 1)
    engine.update_weights(weights, 1)
    assert engine.version == 1
    assert gap() <= 1e-5


def test_a_full_model_takes_no_partial_weights():
    """Leaving tensors out is for a LoRA policy's frozen base only."""
    model = small_model(build_char_tokenizer())
    engine = make_engine(
        "in_process", EngineSpec.of(model, build_char_tokenizer()), module=own_copy(model)
    )
    partial = {k: v for k, v in model.state_dict().items() if "q_proj" not in k}
    with pytest.raises(ValueError, match="missing .*q_proj"):
        engine.update_weights(partial, 1)


def test_the_live_engine_follows_the_policy_version(tmp_path, reward_module):
    trainer = Trainer(
        load_config(None, [*RUN, "trainer.max_steps=2", f"trainer.output_dir={tmp_path}"])
    )
    trainer.train()
    assert trainer.service.engine.version == 2
    with pytest.raises(ValueError, match="version must increase"):
        trainer.service.engine.update_weights(trainer.policy.state_dict(), 2)
