"""The ``algo.teacher`` section: on-policy distillation from a teacher model."""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields

from ardea.config.fields import check_choices, check_range, option
from ardea.errors import ConfigError

TEACHER_KLS = ("reverse_k1", "reverse_k3", "forward_topk")
TEACHER_ENGINES = ("in_process", "vllm")
DEFAULT_TOP_K = 20
SERVED = ("url", "python", "server_args", "timeout_s")  # read by engine=vllm only


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
    engine: str = option(
        "in_process",
        "Where the teacher runs: in_process (the trainer's process and device, model.dtype) or "
        "vllm (a vLLM server scores each rollout's rows by their prompt log-probs; those are "
        "at temperature 1 without top-k / top-p, so the rollouts must be sampled so too).",
        choices=TEACHER_ENGINES,
    )
    url: str | None = option(
        None,
        "engine=vllm: the base URL of a vLLM server serving the teacher (e.g. "
        "http://127.0.0.1:8001); null = ardea starts one on `path` with rollout.vllm.python "
        "and stops it with the run.",
    )
    python: str = option(
        ".venv-vllm/bin/python",
        "engine=vllm without url: the Python of vLLM's environment the teacher's server is "
        "started with (scripts/setup_vllm_venv.sh).",
    )
    server_args: list[str] = option(
        help="engine=vllm without url: extra flags of the teacher's server (e.g. "
        "[--max-logprobs, '50'] for top_k above 20).",
        factory=list,
    )
    timeout_s: float = option(
        120.0, "engine=vllm: seconds one row's scoring request may take (then the run fails)."
    )
    top_k: int = option(
        DEFAULT_TOP_K,
        "kl=forward_topk: how many of the teacher's most likely tokens per position the KL "
        "runs over (>= 1; their probabilities renormalised).",
    )

    def changed(self, names: tuple[str, ...] | None = None) -> list[str]:
        """The options (of ``names``, default all) set away from their defaults."""
        return [
            f.name
            for f in fields(self)
            if (names is None or f.name in names)
            and getattr(self, f.name)
            != (f.default if f.default is not MISSING else f.default_factory())
        ]

    def __post_init__(self) -> None:
        check_choices(self, "algo.teacher")
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise ConfigError(f"algo.teacher.path={self.path!r} must be a directory or null")
        if not math.isfinite(self.coef):
            raise ConfigError(f"algo.teacher.coef={self.coef!r} must be a finite number")
        check_range("algo.teacher.coef", self.coef, low=0.0, low_open=True)
        if self.path is None and self.changed():
            changed = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.changed())
            raise ConfigError(
                f"algo.teacher.{changed} set without a teacher: set algo.teacher.path (the "
                "teacher's directory)"
            )
        for name in self.changed(SERVED):
            if self.engine != "vllm":
                raise ConfigError(
                    f"algo.teacher.{name}={getattr(self, name)!r} is read by engine=vllm only "
                    f"(engine is {self.engine!r}): set algo.teacher.engine=vllm or unset it"
                )
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s < math.inf):
            raise ConfigError(f"algo.teacher.timeout_s={self.timeout_s!r} must be > 0 seconds")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ConfigError(f"algo.teacher.top_k={self.top_k!r} must be an integer >= 1")
        if self.kl != "forward_topk" and self.top_k != DEFAULT_TOP_K:
            raise ConfigError(
                f"algo.teacher.top_k={self.top_k} is read by kl=forward_topk only; "
                f"algo.teacher.kl={self.kl!r} scores the sampled token (unset top_k)"
            )
