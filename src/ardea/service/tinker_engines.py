"""The engines Tinker samplers decode on: ``make_engine`` of the server's ``rollout.engine``.

``in_process`` (the default): each set of sampler weights gets an engine of its own on a
frozen copy of the base with those adapters merged (:class:`~ardea.service.tinker_slot.Direct`).
Any other engine (``vllm``: servers in other processes, ``rollout.vllm.*`` its options) is
shared by the samplers of a base model (:class:`~ardea.service.tinker_slot.EngineSlot`),
built on its first sampler's weights, with its work directory (weights, server logs) under
``<state-dir>/engines/``:

- a training model's weights (a snapshot, or inflight weights) are its LoRA adapters: the
  engine is built on a frozen copy of that LoRA policy, and a later set of the same layout
  (rank, adapted modules) reaches it as the adapters alone (``update_weights`` with the
  adapter tensors: a vLLM engine then syncs the adapter only); a set of another layout
  builds a new engine (a launched server is started again). vLLM takes adapters on the
  attention and MLP projections only (:data:`RUNTIME_ADAPTERS`): a model that also adapts
  the LM head (``train_unembed``, the SDK's default) reaches it as merged full weights;
- the base model's weights are zero adapters on an engine built for adapters, the base's
  full weights otherwise;
- sampler weights saved by an earlier server (``tinker://``, the merged model in
  ``policy/``) are full weights, on an engine built without adapters.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ardea.model import Precision
from ardea.model.dtype_probe import ProbeShapes
from ardea.model.loading import load_tokenizer, resolve_dtype
from ardea.rollout.engine import EngineSpec, engine_factory, make_engine
from ardea.service.tinker_model import ATTN, MICRO_BATCH, MLP
from ardea.service.tinker_sampler import MAX_ROWS, Sampler
from ardea.service.tinker_slot import EngineSlot, Lease, Load

OWN_ENGINE = "in_process"  # the engine each set of sampler weights gets one of
#: the modules whose adapters a shared engine takes as adapters (vLLM's LoRA layers: not
#: the LM head); a layout that adapts others reaches it as merged full weights
RUNTIME_ADAPTERS = ATTN + MLP


@dataclass(frozen=True)
class Base:
    """A served base model: its directory, tokenizer, config and precision."""

    directory: Path
    tokenizer: Any
    config: Any
    precision: Precision


@dataclass(frozen=True)
class Adapters:
    """An engine built for LoRA adapters of one layout; ``zeros``: adapters computing the
    base model (not part of the layout's identity)."""

    rank: int
    modules: tuple[str, ...]
    zeros: dict[str, torch.Tensor] = field(compare=False, hash=False, repr=False)


FULL = "full weights"  # the layout of an engine built without adapters


@dataclass
class Published:
    """A training model's inflight weights: its adapters at the latest inflight save."""

    adapters: dict[str, torch.Tensor]


def adapters_of(source: tuple) -> dict[str, torch.Tensor]:
    """The adapter tensors of a sampling session's ``("adapters", model, state)`` or
    ``("inflight", model, published)`` source."""
    return source[2] if source[0] == "adapters" else source[2].adapters


class SamplerEngines:
    """Builds samplers on the engine ``name`` (module docstring); ``on_worker(fn)`` runs
    ``fn`` where a training model's weights are not being changed (the training thread)."""

    def __init__(self, name: str, options: dict[str, Any] | None, *, work_dir: Path,
                 on_worker: Callable[[Callable[[], Any]], Any], device: torch.device) -> None:  # fmt: skip
        engine_factory(name)  # an unknown name fails here, listing the known ones
        self.name, self.options = name, dict(options or {})
        if name == OWN_ENGINE and self.options:
            raise ValueError(f"the {OWN_ENGINE} engine of the Tinker server takes no options")
        self.shared = name != OWN_ENGINE
        self.work_dir, self.on_worker, self.device = Path(work_dir), on_worker, device
        self.slots: dict[Path, EngineSlot] = {}
        self._lock = threading.Lock()
        self._built = itertools.count()

    def sampler(self, base: Base, key: str, source: tuple) -> Sampler:
        """The sampler of a sampling session's weights (``key``, ``source``)."""
        module = lambda: self._module(base, source)  # noqa: E731 - made when first needed
        if not self.shared:
            return Sampler(module(), base.tokenizer, engine=self.name, precision=base.precision)
        lease = Lease(self._slot(base), key, lambda: self._load(base, source))
        return Sampler(module, base.tokenizer, precision=base.precision, lease=lease,
                       config=base.config)  # fmt: skip

    def publish(self, sampler: Sampler | None, base: Base, key: str, source: tuple) -> None:
        """A training model's inflight weights changed (``source``: its ``("inflight",
        model, published)``): the samplers of ``key`` sample them from now on. Called on
        the worker's thread."""
        if self.shared:
            if sampler is not None:
                sampler.publish()  # its scorer is made again
            self._slot(base).publish(key, lambda: self._load(base, source))
        elif sampler is not None:
            sampler.publish(source[1].merged_copy(adapters_of(source)).state_dict())

    def forget(self, base: Base, key: str) -> None:
        """``key`` names other weights now (sampler weights saved again under a name)."""
        slot = self.slots.get(base.directory)
        if slot is not None:
            slot.forget(key)

    def _slot(self, base: Base) -> EngineSlot:
        with self._lock:
            if base.directory not in self.slots:
                self.slots[base.directory] = EngineSlot(f"tinker-engine-{len(self.slots)}")
            return self.slots[base.directory]

    def _module(self, base: Base, source: tuple) -> torch.nn.Module:
        """The weights of ``source`` as a frozen plain model (adapters merged)."""
        if source[0] in ("adapters", "inflight"):
            adapters = adapters_of(source)
            return self.on_worker(lambda: source[1].merged_copy(adapters))
        return _plain_model(source[1], base.precision, self.device)

    def _load(self, base: Base, source: tuple) -> Load:
        """How the shared engine of ``base`` gets the weights of ``source``."""
        if source[0] in ("adapters", "inflight"):
            model, adapters = source[1], adapters_of(source)
            rank, modules = model.layout
            if set(modules) <= set(RUNTIME_ADAPTERS):
                return Load(Adapters(rank, modules, {}), lambda _layout: adapters,
                            lambda: self._engine(base, self.on_worker(lambda: model.twin(adapters))))  # fmt: skip
            merged = lambda: self.on_worker(lambda: model.merged_copy(adapters))  # noqa: E731
            return Load(FULL, lambda _layout: merged().state_dict(),
                        lambda: self._engine(base, merged()))  # fmt: skip
        directory = Path(source[1])
        is_base = directory.resolve() == base.directory

        def weights(layout):
            return layout.zeros if isinstance(layout, Adapters) else directory

        plain = lambda: self._engine(base, _plain_model(directory, base.precision, self.device))  # noqa: E731
        return Load(None if is_base else FULL, weights, plain)

    def _engine(self, base: Base, module: torch.nn.Module):
        """A new engine ``name`` on ``module`` (a frozen LoRA or plain model), its layout."""
        config = getattr(module, "peft_config", {}).get("default")
        if config is None:
            layout: Any = FULL
        else:
            adapters = {n: p for n, p in module.named_parameters() if "lora_" in n}
            modules = tuple(sorted(config.target_modules))
            layout = Adapters(int(config.r), modules, {n: torch.zeros_like(p)
                                                       for n, p in adapters.items()})  # fmt: skip
        spec = EngineSpec.of(module, base.tokenizer, model_dir=base.directory,
                             precision=base.precision, options=self.options,
                             work_dir=self.work_dir / f"engine{next(self._built)}")  # fmt: skip
        return make_engine(self.name, spec, module=module), layout

    def close(self) -> None:
        with self._lock:
            slots, self.slots = list(self.slots.values()), {}
        for slot in slots:
            slot.close()


def serve_base(directory: Path, device, dtype: str, compute_dtype: str) -> Base:
    """A base model served in ``dtype`` computing in ``compute_dtype`` (``auto``: measured
    at a micro-batch of full-context rows and a sampler's decode batch)."""
    tokenizer = load_tokenizer(directory)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    shapes = None
    if hidden:
        context = int(getattr(config, "max_position_embeddings", 2048))
        intermediate = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
        shapes = ProbeShapes(hidden, intermediate, MICRO_BATCH * context, MAX_ROWS)
    precision = Precision.resolve(compute_dtype, device, resolve_dtype(dtype), shapes=shapes)
    if precision.probe is not None:
        print(f"ardea tinker: {directory.name}: {precision.probe.describe()}", file=sys.stderr,
              flush=True)  # fmt: skip
    return Base(directory, tokenizer, config, precision)


def _plain_model(directory: Path, precision: Precision, device: torch.device) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=precision.params,
                                                 local_files_only=True)  # fmt: skip
    return model.to(device).requires_grad_(False).eval()
