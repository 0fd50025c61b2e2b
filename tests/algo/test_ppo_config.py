"""PPOConfig: defaults, validation messages, OmegaConf structured configs."""

import dataclasses

import pytest
from omegaconf import OmegaConf

import ardea.config.ppo as ppo_config
from ardea.algo import AGG_MODES, KL_ESTIMATORS, NORM_MODES
from ardea.config import PPOConfig
from ardea.errors import ConfigError

VAPO = "ardea.algo.lambda_fn.vapo_length_adaptive_gae"


def test_rejects_unknown_timestep_unit():
    with pytest.raises(ValueError, match="gae_timestep_unit"):
        PPOConfig(gae_timestep_unit="episode")


def test_is_an_omegaconf_structured_config():
    config = OmegaConf.structured(PPOConfig())
    assert config.gae_timestep_unit == "token"
    assert config.gae_lambda == 1.0 and config.discount == 1.0 and config.kl_estimator == "k1"


def test_keeps_a_lambda_function_path_and_its_kwargs():
    config = OmegaConf.structured(PPOConfig(gae_lambda=VAPO, gae_lambda_kwargs={"alpha": 0.5}))
    assert config.gae_lambda == VAPO
    assert config.gae_lambda_kwargs == {"alpha": 0.5}
    merged = OmegaConf.merge(
        config, OmegaConf.from_dotlist(["gae_lambda=1", "eps_clip_higher=0.28"])
    )
    assert OmegaConf.to_object(merged).gae_lambda == 1


def test_structured_from_the_class_validates_on_conversion():
    config = OmegaConf.structured(PPOConfig)
    assert OmegaConf.to_object(config) == PPOConfig()
    bad = OmegaConf.merge(config, OmegaConf.from_dotlist(["gae_timestep_unit=episode"]))
    with pytest.raises(ConfigError, match="gae_timestep_unit='episode' is not allowed"):
        OmegaConf.to_object(bad)


def test_every_field_has_help_text():
    for field in dataclasses.fields(PPOConfig):
        assert field.metadata.get("help"), field.name


def test_name_lists_match_the_algorithm_core():
    assert ppo_config.KL_ESTIMATORS == KL_ESTIMATORS
    assert ppo_config.LOSS_AGG_MODES == AGG_MODES
    assert ppo_config.NORM_MODES == NORM_MODES


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gae_lambda": float("nan")}, "Static gae_lambda must be finite"),
        ({"gae_lambda": 1.2}, r"gae_lambda=1.2 is out of range; expected a value in \[0.0, 1.0\]"),
        ({"gae_lambda": True}, "not a bool"),
        ({"gae_lambda": "vapo"}, "dotted path"),
        ({"discount": 1.5}, "discount"),
        ({"kl_ctl": -0.1}, "kl_ctl"),
        (
            {"kl_estimator": "k4"},
            "kl_estimator='k4' is not allowed; choose one of: 'k1', 'k2', 'k3', 'low_var_kl'",
        ),
        ({"reward_scaling": 0.0}, "reward_scaling"),
        ({"reward_clip": float("inf")}, "reward_clip"),
        ({"reward_norm": "std"}, "reward_norm"),
        ({"adv_norm": "token"}, "adv_norm"),
        ({"eps_clip": 1.0}, "eps_clip"),
        ({"eps_clip_higher": 0.0}, "eps_clip_higher"),
        ({"c_clip": 1.0}, "c_clip"),
        ({"behav_imp_weight_cap": 0.5}, "behav_imp_weight_cap"),
        ({"value_eps_clip": -0.2}, "value_eps_clip"),
        ({"loss_agg_mode": "mean"}, "loss_agg_mode"),
        ({"adv_estimator": ""}, "adv_estimator"),
    ],
)
def test_bad_values_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        PPOConfig(**overrides)


def test_valid_values_are_accepted():
    PPOConfig(
        gae_lambda="0.5",
        eps_clip_higher=0.28,
        c_clip=3.0,
        value_eps_clip=None,
        behav_imp_weight_cap=5.0,
        reward_norm="group",
        adv_norm="batch",
        gae_timestep_unit="turn",
    )
