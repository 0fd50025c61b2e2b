"""The ValueModel critic: seed 001's cases, warm start, gradients, save/load."""

import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForTokenClassification

from ardea.model import ModelLoadError, ValueModel, build_tiny_model, position_ids_from_mask

from .conftest import random_ids


def warm_started(policy) -> ValueModel:
    """Seed 001's recipe: a fresh critic from the policy's config, then the policy's
    state dict loaded non-strictly; only the value head may be missing."""
    critic = ValueModel(policy.config)
    result = critic.load_state_dict(policy.state_dict(), strict=False)
    assert set(result.unexpected_keys) == {"lm_head.weight"}
    assert sorted(result.missing_keys) == ["value_head.bias", "value_head.weight"]
    return critic


def policy_last_hidden(policy, input_ids, attention_mask=None, position_ids=None):
    """Reference trunk: the policy's own forward, last entry of ``hidden_states``."""
    with torch.no_grad():
        outputs = policy(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_hidden_states=True,
        )
    return outputs.hidden_states[-1]


@pytest.mark.parametrize("make_critic", [warm_started, ValueModel.from_policy])
def test_trunk_matches_policy_hidden_states(policy, make_critic):
    """A ones head with zero bias returns the row-wise sum of the policy's final hidden
    states, with a left-padded row and its attention mask."""
    critic = make_critic(policy)
    with torch.no_grad():
        critic.value_head.weight.fill_(1.0)
        critic.value_head.bias.zero_()
    input_ids = random_ids(2, 10, seed=2)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        values = critic(input_ids, attention_mask=mask)
    hidden = policy_last_hidden(policy, input_ids, mask, position_ids_from_mask(mask))
    assert values.shape == (2, 10)
    assert values.dtype == torch.float32
    torch.testing.assert_close(values, hidden.sum(dim=-1), atol=1e-5, rtol=0)
    # Without a mask the positions are plain 0..S-1, as in the policy's default forward.
    with torch.no_grad():
        unmasked = critic(input_ids)
    torch.testing.assert_close(
        unmasked, policy_last_hidden(policy, input_ids).sum(-1), atol=1e-5, rtol=0
    )


def test_left_padding_does_not_change_values(policy):
    critic = ValueModel.from_policy(policy)
    with torch.no_grad():
        critic.value_head.weight.normal_()
    row = random_ids(1, 6, seed=4)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), row], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        torch.testing.assert_close(
            critic(padded, attention_mask=mask)[:, 3:], critic(row), atol=1e-5, rtol=0
        )


def test_zero_head_outputs_exactly_zero(policy):
    critic = warm_started(policy)
    with torch.no_grad():
        values = critic(random_ids(2, 8))
    assert values.shape == (2, 8)
    assert torch.count_nonzero(values) == 0
    assert torch.count_nonzero(ValueModel.from_policy(policy).value_head.weight) == 0


def test_rejects_packed_one_dimensional_input(policy):
    critic = ValueModel(policy.config)
    with pytest.raises(ValueError, match="critic input_ids must be 2-D"):
        critic(random_ids(1, 16)[0])
    with pytest.raises(ValueError, match="critic input_ids"):
        critic(random_ids(1, 16).float())


def test_from_policy_copies_without_sharing(policy):
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    critic = ValueModel.from_policy(policy)
    for name, param in critic.model.named_parameters():
        policy_param = policy.model.get_parameter(name)
        assert torch.equal(param, policy_param), name
        assert param.data_ptr() != policy_param.data_ptr(), name
    critic.train()
    with torch.no_grad():
        critic.value_head.weight.fill_(0.1)
    loss = critic(random_ids(2, 5)).sum()
    loss.backward()
    torch.optim.SGD(critic.parameters(), lr=1.0).step()
    assert all(p.grad is None for p in policy.parameters())
    for key, value in policy.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert not torch.equal(critic.model.norm.weight, policy.model.norm.weight)


def test_head_gradients_follow_the_formula(policy):
    """values = w . h + b, so d(sum values)/db = N*S and d/dw = sum of hidden states;
    with w = 0 the backbone gets no gradient."""
    critic = ValueModel.from_policy(policy)
    input_ids = random_ids(3, 7, seed=5)
    critic(input_ids).sum().backward()
    hidden = policy_last_hidden(policy, input_ids)
    assert critic.value_head.bias.grad.item() == 3 * 7
    torch.testing.assert_close(
        critic.value_head.weight.grad[0], hidden.sum(dim=(0, 1)), atol=1e-4, rtol=1e-6
    )
    assert torch.count_nonzero(critic.model.norm.weight.grad) == 0


def test_save_and_load_round_trip_is_bit_exact(policy, tmp_path):
    critic = ValueModel.from_policy(policy)
    with torch.no_grad():
        critic.value_head.weight.normal_()
        critic.value_head.bias.fill_(0.25)
    critic.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    loaded = ValueModel.from_pretrained(tmp_path)
    assert loaded.state_dict().keys() == critic.state_dict().keys()
    for key, value in critic.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    input_ids = random_ids(2, 9, seed=6)
    mask = torch.ones_like(input_ids)
    mask[0, 6:] = 0
    with torch.no_grad():
        assert torch.equal(loaded(input_ids, mask), critic(input_ids, mask))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_saved_critic_loads_in_plain_transformers(tokenizer, tmp_path, arch):
    critic = ValueModel.from_policy(build_tiny_model(tokenizer, arch=arch))
    with torch.no_grad():
        critic.value_head.weight.normal_()
        critic.value_head.bias.fill_(-0.5)
    critic.save_pretrained(tmp_path)
    plain = AutoModelForTokenClassification.from_pretrained(tmp_path, local_files_only=True)
    assert (
        type(plain).__name__ == f"{'Qwen2' if arch == 'qwen2' else 'Llama'}ForTokenClassification"
    )
    plain.train()  # classifier dropout is saved as 0: train mode gives the same values
    input_ids = random_ids(2, 8, seed=7)
    with torch.no_grad():
        torch.testing.assert_close(
            plain(input_ids).logits[..., 0], critic(input_ids), atol=1e-6, rtol=0
        )


def test_from_pretrained_errors_name_the_path(tmp_path, policy):
    with pytest.raises(
        ModelLoadError, match=re.escape(f"critic directory {tmp_path / 'nope'} does not exist")
    ):
        ValueModel.from_pretrained(tmp_path / "nope")
    ValueModel.from_policy(policy).save_pretrained(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(
        ModelLoadError, match=re.escape(f"critic directory {tmp_path} has no config.json")
    ):
        ValueModel.from_pretrained(tmp_path)


def test_from_pretrained_refuses_incomplete_weights(tmp_path, policy):
    ValueModel.from_policy(policy).save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["score.bias"]
    state["extra.weight"] = torch.zeros(1)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError) as error:
        ValueModel.from_pretrained(tmp_path)
    message = str(error.value)
    assert "\n" not in message
    assert f"critic weights in {tmp_path}" in message
    assert "2 missing or unexpected tensors (extra.weight, score.bias)" in message
