"""The ``algo.teacher`` section: on-policy distillation from a teacher model."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ardea.config.fields import check_choices, check_range, option
from ardea.errors import ConfigError

TEACHER_KLS = ("reverse_k1", "reverse_k3", "forward_topk")
DEFAULT_TOP_K = 20


@dataclass
class TeacherConfig:
    path: str | None = option(
        None,
        "Online RL: a teacher model directory (a Hugging Face causal LM with the policy's "
        "tokenizer) that scores every sampled token; null = no teacher.",
    )
    kl: str = option(
        "reverse_k1",
        "How the teacher teaches. reverse_k1 / reverse_k3: a per-token reward -coef * "
        "KL(student || teacher) estimated at the sampled token (k1: log pi - log pi_teacher; "
        "k3: r - 1 - log r, r = pi_teacher / pi). forward_topk: a loss term coef * "
        "KL(teacher || student) over the teacher's top_k tokens at every sampled position.",
        choices=TEACHER_KLS,
    )
    coef: float = option(
        1.0, "Weight of the teacher's per-token reward, or of its forward-KL loss term (> 0)."
    )
    top_k: int = option(
        DEFAULT_TOP_K,
        "kl=forward_topk: how many of the teacher's most likely tokens per position the KL "
        "runs over (>= 1; their probabilities renormalised).",
    )

    def __post_init__(self) -> None:
        check_choices(self, "algo.teacher")
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise ConfigError(f"algo.teacher.path={self.path!r} must be a directory or null")
        if not math.isfinite(self.coef):
            raise ConfigError(f"algo.teacher.coef={self.coef!r} must be a finite number")
        check_range("algo.teacher.coef", self.coef, low=0.0, low_open=True)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ConfigError(f"algo.teacher.top_k={self.top_k!r} must be an integer >= 1")
        if self.kl != "forward_topk" and self.top_k != DEFAULT_TOP_K:
            raise ConfigError(
                f"algo.teacher.top_k={self.top_k} is read by kl=forward_topk only; "
                f"algo.teacher.kl={self.kl!r} scores the sampled token (unset top_k)"
            )
