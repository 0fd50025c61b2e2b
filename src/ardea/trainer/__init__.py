"""Strategies, the training loop, checkpoints, logging and reports."""

from ardea.trainer.loop import Trainer
from ardea.trainer.report import draw_report
from ardea.trainer.stages import run, run_stages
from ardea.trainer.strategies import Strategy, make_strategy, register_strategy, strategy_names

__all__ = [
    "Strategy",
    "Trainer",
    "draw_report",
    "make_strategy",
    "register_strategy",
    "run",
    "run_stages",
    "strategy_names",
]
