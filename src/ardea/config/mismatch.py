"""The ``algo.mismatch`` section: correcting the train-inference mismatch of online RL."""

from __future__ import annotations

from dataclasses import dataclass

from ardea.config.fields import check_choices, check_range, option
from ardea.errors import ConfigError

MISMATCH_MODES = ("none", "token_tis", "seq_tis", "token_mis", "seq_mis")


@dataclass
class MismatchConfig:
    mode: str = option(
        "none",
        "Online RL: correct the gap between the engine's behaviour log-probs and the trainer's "
        "(the ratio is then taken against the trainer's own log-probs before the step's "
        "updates, and each token's loss weighted): token_tis / seq_tis (truncated importance "
        "sampling: weight min(w, cap), w = pi_trainer / pi_behaviour per token or per "
        "sequence), token_mis / seq_mis (masked: weight w inside [low, high], 0 outside), "
        "none.",
        choices=MISMATCH_MODES,
    )
    cap: float = option(2.0, "TIS: the cap C of the importance weight (>= 1).")
    low: float = option(0.5, "MIS: tokens / sequences with a weight below this are masked.")
    high: float = option(2.0, "MIS: tokens / sequences with a weight above this are masked.")

    def __post_init__(self) -> None:
        check_choices(self, "algo.mismatch")
        check_range("algo.mismatch.cap", self.cap, low=1.0)
        check_range("algo.mismatch.low", self.low, low=0.0, high=1.0)
        check_range("algo.mismatch.high", self.high, low=1.0)
        if self.mode.endswith("tis") and (self.low, self.high) != (0.5, 2.0):
            raise ConfigError(
                f"algo.mismatch.low/high are read by the masking modes; mode={self.mode!r} "
                "truncates at algo.mismatch.cap"
            )
        if self.mode.endswith("mis") and self.cap != 2.0:
            raise ConfigError(
                f"algo.mismatch.cap is read by the truncating modes; mode={self.mode!r} masks "
                "outside [algo.mismatch.low, algo.mismatch.high]"
            )
