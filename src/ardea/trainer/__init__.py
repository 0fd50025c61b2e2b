"""Strategies, the training loop, checkpoints, logging and reports."""

from ardea.trainer.checks import check_config
from ardea.trainer.loop import Trainer
from ardea.trainer.report import draw_report
from ardea.trainer.stages import plan_stages, run, run_stages, starts_from_previous
from ardea.trainer.strategies import Strategy, make_strategy, register_strategy, strategy_names

__all__ = [
    "Strategy",
    "Trainer",
    "check_config",
    "draw_report",
    "make_strategy",
    "plan_stages",
    "register_strategy",
    "run",
    "run_stages",
    "starts_from_previous",
    "strategy_names",
]
