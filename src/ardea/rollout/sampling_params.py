"""How an engine samples: :class:`SamplingParams` (temperature, truncation, stops, lengths,
the seed and the rows of its random numbers), checked when made."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ardea.config.fields import check_temperature


@dataclass
class SamplingParams:
    """How to sample completions. Validated on construction; errors name the field and range."""

    temperature: float = field(
        default=1.0,
        metadata={"help": "Softmax temperature T: 0 means greedy (argmax); otherwise >= 1e-4."},
    )
    top_p: float = field(
        default=1.0,
        metadata={
            "help": "Nucleus sampling: keep the smallest top set with mass >= top_p. 1 = off."
        },
    )
    top_k: int = field(default=0, metadata={"help": "Keep only the k most likely tokens. 0 = off."})
    max_new_tokens: int = field(
        default=64, metadata={"help": "Most tokens generated per completion (>= 1)."}
    )
    min_new_tokens: int = field(
        default=0,
        metadata={
            "help": "Stop tokens (eos and stop_token_ids) are masked out until this many "
            "tokens exist (<= max_new_tokens); log-probs are those of the masked distribution."
        },
    )
    stop_token_ids: list[int] = field(
        default_factory=list,
        metadata={"help": "Extra stop tokens; the engine's eos ids always stop too."},
    )
    stop: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Stop strings: a completion ends at the token that completes one in its "
            "text (kept, finish reason stop)."
        },
    )
    seed: int | None = field(
        default=None,
        metadata={"help": "Seed for a reproducible call, independent of the global RNG state."},
    )
    n: int = field(default=1, metadata={"help": "Completions per prompt, grouped by prompt."})
    routed_experts: bool = field(
        default=False,
        metadata={
            "help": "Also return the experts each MoE layer routed every token to "
            "(Completion.routed_experts), for routing replay; an engine that cannot refuses."
        },
    )
    row_ids: list[int] | None = field(
        default=None,
        metadata={
            "help": "One id per row of the call (prompt × n, prompt-major), or None for "
            "0, 1, ...: row r samples with the random numbers of row row_ids[r] of a seeded "
            "call, so a rollout split over calls or processes, or played turn by turn, "
            "samples what one call would."
        },
    )

    @classmethod
    def of(
        cls, rollout: Any, *, greedy: bool = False, routed_experts: bool = False
    ) -> SamplingParams:
        """The sampling options of a run's ``rollout`` config section; ``greedy``: argmax
        decoding (temperature 0, no truncation, no forced length); ``routed_experts``: see
        the field."""
        if greedy:
            return cls(temperature=0.0, max_new_tokens=rollout.max_new_tokens)
        return cls(
            routed_experts=routed_experts,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            max_new_tokens=rollout.max_new_tokens,
            min_new_tokens=rollout.min_new_tokens,
        )

    @property
    def logprob_sampling(self) -> dict[str, float | int]:
        """The distribution the behaviour log-probs describe: ``temperature``, ``top_k``,
        ``top_p`` (greedy decoding: the untempered, untruncated softmax)."""
        if self.temperature == 0:
            return {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        return {"temperature": float(self.temperature), "top_k": self.top_k, "top_p": self.top_p}

    def __post_init__(self) -> None:
        check_temperature("temperature", self.temperature)
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {p!r}")
        check_int("top_k", self.top_k, 0, "0 = off")
        check_int("max_new_tokens", self.max_new_tokens, 1)
        check_int("min_new_tokens", self.min_new_tokens, 0, upper=self.max_new_tokens)
        check_int("n", self.n, 1)
        if not isinstance(self.routed_experts, bool):
            raise ValueError(f"routed_experts must be a bool, got {self.routed_experts!r}")
        if self.row_ids is not None:
            if isinstance(self.row_ids, str | bytes) or not isinstance(self.row_ids, Sequence):
                raise ValueError(f"row_ids must be a list of ints or None, got {self.row_ids!r}")
            self.row_ids = list(self.row_ids)
            for i, row in enumerate(self.row_ids):
                check_int(f"row_ids[{i}]", row, 0)
        if self.seed is not None:
            check_int("seed", self.seed, 0, "or None", upper=2**63 - 1)
        if isinstance(self.stop_token_ids, str | bytes) or not isinstance(
            self.stop_token_ids, Sequence
        ):
            raise ValueError(f"stop_token_ids must be a list of ints, got {self.stop_token_ids!r}")
        self.stop_token_ids = list(self.stop_token_ids)
        for i, tok in enumerate(self.stop_token_ids):
            check_int(f"stop_token_ids[{i}]", tok, 0)
        if isinstance(self.stop, str | bytes) or not isinstance(self.stop, Sequence):
            raise ValueError(f"stop must be a list of strings, got {self.stop!r}")
        self.stop = list(self.stop)
        for i, text in enumerate(self.stop):
            if not isinstance(text, str) or not text:
                raise ValueError(f"stop[{i}] must be a non-empty string, got {text!r}")

    def rows(self, n_rows: int) -> list[int]:
        """The row ids of a call with ``n_rows`` rows (prompts × n); ValueError when
        ``row_ids`` has another length."""
        if self.row_ids is None:
            return list(range(n_rows))
        if len(self.row_ids) != n_rows:
            raise ValueError(
                f"row_ids has {len(self.row_ids)} ids for a call of {n_rows} rows (prompts × n)"
            )
        return self.row_ids


def check_int(name: str, value: object, lower: int, note: str = "", upper: int | None = None):
    """Raise ValueError unless ``lower <= value (<= upper)`` and value is an int (not a bool)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= lower
    ok = ok and (upper is None or value <= upper)
    if not ok:
        bound = f">= {lower}" if upper is None else f"in [{lower}, {upper}]"
        extra = f" ({note})" if note else ""
        raise ValueError(f"{name} must be an int {bound}{extra}, got {value!r}")
