"""The ``algo.teacher`` section: on-policy distillation from a teacher model."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ardea.config.fields import check_choices, check_range, option
from ardea.errors import ConfigError

TEACHER_KLS = ("reverse_k1", "reverse_k3")


@dataclass
class TeacherConfig:
    path: str | None = option(
        None,
        "Online RL: a teacher model directory (a Hugging Face causal LM with the policy's "
        "tokenizer) that scores every sampled token; null = no teacher.",
    )
    kl: str = option(
        "reverse_k1",
        "How the teacher's log-probs become a per-token reward, -coef * KL(student || "
        "teacher) estimated at the sampled token: reverse_k1 (log pi - log pi_teacher) or "
        "reverse_k3 (r - 1 - log r, r = pi_teacher / pi).",
        choices=TEACHER_KLS,
    )
    coef: float = option(1.0, "Weight of the teacher's per-token reward (> 0).")

    def __post_init__(self) -> None:
        check_choices(self, "algo.teacher")
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise ConfigError(f"algo.teacher.path={self.path!r} must be a directory or null")
        if not math.isfinite(self.coef):
            raise ConfigError(f"algo.teacher.coef={self.coef!r} must be a finite number")
        check_range("algo.teacher.coef", self.coef, low=0.0, low_open=True)
