"""Typed configuration: dataclasses per section, YAML + dotted overrides (OmegaConf)."""

from ardea.config.loader import config_to_yaml, describe_config, load_config
from ardea.config.ppo import PPOConfig
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
    "AlgoConfig",
    "ArdeaConfig",
    "DataConfig",
    "LoggingConfig",
    "ModelConfig",
    "PPOConfig",
    "RolloutConfig",
    "TrainerConfig",
    "config_to_yaml",
    "describe_config",
    "load_config",
]
