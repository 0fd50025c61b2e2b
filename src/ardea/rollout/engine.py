"""The generation-engine interface: sampling parameters, completions, and the engine contract.

An engine turns token-id prompts into completions carrying the behaviour log-prob of every
generated token and the policy version of the weights that produced them. Every engine (the
in-process one, one that drives a server) implements :class:`GenerationEngine` — generate,
``version``, ``max_context``, ``stop_token_ids``, ``update_weights`` (named tensors or a
directory of saved weights) and ``close`` — and nothing outside an engine reaches into it
(there is no ``engine.model``). An engine is built from an :class:`EngineSpec`, what a
remote engine also has (the model's config and directory, the tokenizer, the stop ids, the
precision); the in-process engine additionally takes the live module. Engines are registered
by name (``rollout.engine``, :func:`register_engine`), so callers never special-case one.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file

from ardea.config.fields import check_temperature
from ardea.registry import Registry, callable_check

FinishReason = Literal["stop", "length"]


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
    def of(cls, rollout: Any, *, greedy: bool = False) -> SamplingParams:
        """The sampling options of a run's ``rollout`` config section; ``greedy``: argmax
        decoding (temperature 0, no truncation, no forced length)."""
        if greedy:
            return cls(temperature=0.0, max_new_tokens=rollout.max_new_tokens)
        return cls(
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
        _check_int("top_k", self.top_k, 0, "0 = off")
        _check_int("max_new_tokens", self.max_new_tokens, 1)
        _check_int("min_new_tokens", self.min_new_tokens, 0, upper=self.max_new_tokens)
        _check_int("n", self.n, 1)
        if self.row_ids is not None:
            if isinstance(self.row_ids, str | bytes) or not isinstance(self.row_ids, Sequence):
                raise ValueError(f"row_ids must be a list of ints or None, got {self.row_ids!r}")
            self.row_ids = list(self.row_ids)
            for i, row in enumerate(self.row_ids):
                _check_int(f"row_ids[{i}]", row, 0)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, "or None", upper=2**63 - 1)
        if isinstance(self.stop_token_ids, str | bytes) or not isinstance(
            self.stop_token_ids, Sequence
        ):
            raise ValueError(f"stop_token_ids must be a list of ints, got {self.stop_token_ids!r}")
        self.stop_token_ids = list(self.stop_token_ids)
        for i, tok in enumerate(self.stop_token_ids):
            _check_int(f"stop_token_ids[{i}]", tok, 0)
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


def _check_int(name: str, value: object, lower: int, note: str = "", upper: int | None = None):
    """Raise ValueError unless ``lower <= value (<= upper)`` and value is an int (not a bool)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= lower
    ok = ok and (upper is None or value <= upper)
    if not ok:
        bound = f">= {lower}" if upper is None else f"in [{lower}, {upper}]"
        extra = f" ({note})" if note else ""
        raise ValueError(f"{name} must be an int {bound}{extra}, got {value!r}")


@dataclass
class Completion:
    """One generated continuation of one prompt.

    ``token_ids`` includes the stop token when one was produced (``finish_reason == "stop"``);
    ``logprobs[i]`` is the behaviour log-prob of ``token_ids[i]`` (see the engine for how
    temperature and truncation enter); ``version`` is the policy version of the weights used.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    version: int


Weights = Mapping[str, torch.Tensor] | str | os.PathLike
"""New weights for :meth:`GenerationEngine.update_weights`: a model state dict, or a
directory holding them as ``*.safetensors`` files (what ``save_pretrained`` writes)."""


@dataclass(frozen=True)
class EngineSpec:
    """What every engine is built from, in process or remote.

    ``model_config``: the model's Hugging Face config (architecture, vocabulary, context);
    ``tokenizer``; ``stop_token_ids``: the ids that end a completion (:func:`stop_token_ids`);
    ``model_dir``: a directory with the weights (None: the model was built in code);
    ``precision``: the :class:`ardea.model.Precision` forwards compute under (None: the
    parameters' dtype); ``options``: the engine's own settings (``rollout.<engine>``, e.g.
    ``rollout.vllm``, as a dict); ``work_dir``: where it may write (weights, server logs).
    """

    model_config: Any
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    model_dir: str | None = None
    precision: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)
    work_dir: str | None = None

    @classmethod
    def of(
        cls,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        model_dir=None,
        precision=None,
        options: Mapping[str, Any] | None = None,
        work_dir=None,
    ) -> EngineSpec:
        """The spec of a built ``model`` (its config and generation config's eos ids)."""
        stops = tuple(stop_token_ids(model, tokenizer))
        path = None if model_dir is None else str(model_dir)
        work = None if work_dir is None else str(work_dir)
        return cls(model.config, tokenizer, stops, path, precision, dict(options or {}), work)


class GenerationEngine(abc.ABC):
    """Token-id prompts + :class:`SamplingParams` → completions with behaviour log-probs.

    An engine owns its weights: :meth:`update_weights` is the only way new weights reach it,
    and it loads them and publishes ``version`` as one atomic step, so a ``generate`` call
    never labels tokens from one set of weights with another version (a call in progress
    finishes on the weights and version it started with).
    """

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Return ``len(prompts) * params.n`` completions: prompt 0's n samples, then prompt 1's."""

    @abc.abstractmethod
    def update_weights(self, weights: Weights, version: int) -> None:
        """Load ``weights`` (a model state dict, or a directory of ``*.safetensors`` files
        with one) as policy ``version`` (> the current)."""

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """Policy version of the weights the next ``generate`` call will use."""

    @property
    @abc.abstractmethod
    def max_context(self) -> int | None:
        """Most positions a prompt plus its completion may take (None: no limit known)."""

    @property
    @abc.abstractmethod
    def stop_token_ids(self) -> list[int]:
        """The ids that always end a completion (the model's end-of-sequence ids)."""

    def close(self) -> None:  # noqa: B027 - an engine without resources has nothing to do
        """Release what the engine holds (a server, a process, memory); idempotent."""

    def metrics(self) -> dict[str, float]:
        """The engine's own metrics of its last weight update (e.g.
        ``vllm/sync_logprob_error``), logged with the step's; none by default."""
        return {}


def check_next_version(version: object, current: int) -> None:
    """Raise ValueError unless ``version`` is an int above ``current``: a version names one
    set of weights, and an engine's versions only grow."""
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"version must be an int, got {version!r}")
    if version <= current:
        raise ValueError(f"version must increase: got {version}, current version is {current}")


def load_weights(weights: Weights) -> Mapping[str, torch.Tensor]:
    """``weights`` as named tensors: a mapping as it is, or every ``*.safetensors`` file of a
    directory (never a pickle), merged; an error names a path without any."""
    if isinstance(weights, Mapping):
        return weights
    path = Path(weights)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise ValueError(f"no *.safetensors weights in {str(path)!r}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(file))
    return tensors


def check_prompts(
    prompts: Sequence[Sequence[int]],
    *,
    vocab_size: int,
    max_new_tokens: int,
    max_positions: int | None,
) -> None:
    """Raise ValueError naming the prompt index for an empty prompt, a token id outside
    ``[0, vocab_size)``, or ``len(prompt) + max_new_tokens > max_positions``."""
    if isinstance(prompts, str | bytes | torch.Tensor) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str | bytes) or not isinstance(prompt, Sequence):
            raise ValueError(f"prompts[{i}] must be a list of token ids, got {prompt!r:.60}")
        if len(prompt) == 0:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token")
        bad = next((t for t in prompt if not isinstance(t, int)), None)
        if bad is None:
            bad = next((t for t in (min(prompt), max(prompt)) if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(
                f"prompts[{i}] contains token id {bad!r}; ids must be ints in "
                f"[0, {vocab_size}) (the model's vocabulary size)"
            )
        if max_positions is not None and len(prompt) + max_new_tokens > max_positions:
            raise ValueError(
                f"prompts[{i}] has {len(prompt)} tokens; with max_new_tokens={max_new_tokens} "
                f"that is {len(prompt) + max_new_tokens} positions, beyond the model's "
                f"max_position_embeddings={max_positions}. Shorten the prompt or lower "
                "max_new_tokens."
            )


def check_state_dict(
    own: Mapping[str, torch.Tensor], state_dict: Mapping[str, torch.Tensor]
) -> None:
    """Raise ValueError unless ``state_dict`` can replace ``own`` (a model's state dict)
    exactly: no missing, unexpected or mis-shaped tensors. A key may be missing only if in
    ``own`` it aliases (shares storage with) a key that is present, as tied embeddings do."""
    unexpected = sorted(set(state_dict) - set(own))
    present = {own[k].data_ptr() for k in state_dict if k in own}
    missing = sorted(k for k in own if k not in state_dict and own[k].data_ptr() not in present)
    shapes = [
        f"{k}: {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in state_dict.items()
        if k in own and tuple(v.shape) != tuple(own[k].shape)
    ]
    if unexpected or missing or shapes:
        raise ValueError(
            "state_dict does not match the model: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}, shape mismatches {shapes[:5]}"
        )


EngineFactory = Callable[..., GenerationEngine]
ENGINES: Registry[EngineFactory] = Registry(
    "generation engine", "engines", field="rollout.engine", check=callable_check
)


def register_engine(name: str) -> Callable[[EngineFactory], EngineFactory]:
    """Decorator registering ``factory(spec: EngineSpec, *, module, version) -> engine`` as
    ``rollout.engine=<name>``. ``module`` is the live ``nn.Module`` an in-process engine
    generates with (None for engines that load ``spec.model_dir`` themselves); ``version``
    the policy version of the initial weights."""
    return ENGINES.register(name)


def engine_factory(name: str) -> EngineFactory:
    """The engine factory ``name`` (registered, or a dotted path to your own); an unknown
    name lists the known ones."""
    return ENGINES.get(name)


def make_engine(
    name: str, spec: EngineSpec, *, module: torch.nn.Module | None = None, version: int = 0
) -> GenerationEngine:
    """The engine ``rollout.engine=<name>`` built from ``spec`` (and ``module``, for an
    engine that generates with a live module: it shares that module's weights)."""
    return engine_factory(name)(spec, module=module, version=version)


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a completion: the generation config's eos ids, else the tokenizer's."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured]
    ids = [i for i in ids if i is not None] or [tokenizer.eos_token_id]
    return sorted(set(ids))
