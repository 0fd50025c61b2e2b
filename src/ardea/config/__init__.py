"""Typed configuration: dataclasses per section, YAML + dotted overrides (OmegaConf)."""

from ardea.config.agent import AgentConfig
from ardea.config.loader import (
    DEFAULT_RECIPE,
    config_to_yaml,
    load_config,
    stage_configs,
)
from ardea.config.ppo import PPOConfig
from ardea.config.reference import config_keys, describe_config
from ardea.config.schema import (
    AlgoConfig,
    ArdeaConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    RolloutConfig,
    TrainerConfig,
)

__all__ = [
    "DEFAULT_RECIPE",
    "AgentConfig",
    "AlgoConfig",
    "ArdeaConfig",
    "DataConfig",
    "LoggingConfig",
    "ModelConfig",
    "PPOConfig",
    "RolloutConfig",
    "TrainerConfig",
    "config_keys",
    "config_to_yaml",
    "describe_config",
    "load_config",
    "stage_configs",
]
