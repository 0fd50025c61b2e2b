"""The Tinker API's operations on ardea's parts, without HTTP (:mod:`tinker_app` serves them).

Sessions and ids follow the SDK: a session ``s-<n>``, models ``<session>:train:<k>``,
sampling sessions ``<session>:sample:<k>``. Training operations (create, forward_backward,
optim_step, saves, loads) run on one worker thread, each model's in ``seq_id`` order
(:mod:`tinker_futures`), in the server's precision (``dtype``, ``compute_dtype``: ardea's
``model.dtype`` and ``model.compute_dtype``); sampling is decoded by engines of the
``rollout.engine`` registry (:mod:`tinker_sampling`, :mod:`tinker_engines`). Base models are
local directories served under the names given at start (and their paths).

Every request is checked whole before anything is queued (:mod:`tinker_fields`); a training
request refused that way still takes its ``seq_id``'s place, so the model's later requests
run (:meth:`TinkerService._in_order`).
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ardea.model.loading import check_model_dir
from ardea.model.lora import save_policy
from ardea.service.tinker_engines import Published, SamplerEngines, serve_base
from ardea.service.tinker_fields import (
    MAX_ID_NUMBER,
    MAX_INT32,
    MAX_SEQ,
    SESSION_ID,
    Fields,
    TinkerLimits,
    shown,
)
from ardea.service.tinker_futures import Futures, Worker
from ardea.service.tinker_model import LoraSpec, TrainingModel, adam_params
from ardea.service.tinker_sampler import Sampler
from ardea.service.tinker_sampling import Sampling, check_sampling_id
from ardea.service.tinker_store import KINDS, Store, TinkerPath, check_model_id, iso
from ardea.service.tinker_wire import (
    Busy,
    WireError,
    forward_backward_call,
    forward_backward_output,
    parse_forward_backward,
)
from ardea.trainer.setup import resolve_device


class TinkerService:
    """The server's state: base models, sessions, trained models, samplers, futures."""

    def __init__(
        self, bases: dict[str, Path], state_dir: Path, *, samplers: int = 3, device: str = "cpu",
        limits: TinkerLimits | None = None, engine: str = "in_process",
        engine_options: dict[str, Any] | None = None, dtype: str = "float32",
        compute_dtype: str = "float32",
    ) -> None:  # fmt: skip
        if not bases:
            raise WireError("the Tinker server needs at least one base model directory")
        self.limits = limits or TinkerLimits()
        self.bases = {name: check_model_dir(path).resolve() for name, path in bases.items()}
        self.device = resolve_device(device)
        self.served = {path: serve_base(path, self.device, dtype, compute_dtype)
                       for path in set(self.bases.values())}  # fmt: skip
        self.tokenizers = {path: base.tokenizer for path, base in self.served.items()}
        self.configs = {path: base.config for path, base in self.served.items()}
        self.store = Store(state_dir)
        self.futures = Futures()
        self.worker = Worker(self.futures, self.limits.max_queued)
        self.engines = SamplerEngines(engine, engine_options, work_dir=self.store.root / "engines",
                                      on_worker=self.worker.call, device=self.device)  # fmt: skip
        self.sampling = Sampling(self.store, self.futures, self.limits, samplers, self._sampler)
        self.models: dict[str, tuple[str, TrainingModel]] = {}  # id -> (base name, model)
        self.published: dict[str, Published] = {}  # model id -> its inflight weights
        self._sessions = itertools.count(1)
        self._created: dict[str, dict[str, Any]] = {}  # create retries
        self._lock = threading.Lock()
        self.started = time.time()

    # -- names -----------------------------------------------------------------------
    def base_dir(self, name: Any, at: str = "base_model") -> Path:
        if isinstance(name, str) and name in self.bases:
            return self.bases[name]
        if isinstance(name, str) and 0 < len(name) <= 4096 and "\0" not in name:
            as_path = Path(name).expanduser().resolve()
            if as_path in self.tokenizers:
                return as_path
        raise WireError(f"unknown {at} {shown(name)}; served: {', '.join(sorted(self.bases))}")

    def model(self, model_id: Any) -> tuple[str, TrainingModel]:
        with self._lock:
            found = self.models.get(check_model_id(model_id))
        if found is None:
            raise WireError(f"unknown model_id {model_id!r}: create it first")
        return found

    def new_session(self) -> str:
        return f"s{int(self.started)}-{next(self._sessions)}"

    def capabilities(self) -> dict[str, Any]:
        models = [{"model_name": name, "trainable": True, "sampleable": True,
                   "max_context_length": getattr(self.configs[path], "max_position_embeddings",
                                                 None)}
                  for name, path in sorted(self.bases.items())]  # fmt: skip
        return {"supported_models": models}

    def future(self, body: dict[str, Any]):
        request_id = Fields(body, "retrieve_future").text("request_id", max_length=64)
        return request_id, self.futures.get(request_id)

    # -- training models -------------------------------------------------------------
    def _in_order(self, body: dict[str, Any], route: str,
                  prepare: Callable[[TrainingModel], Callable[[], Any]]) -> dict[str, Any]:  # fmt: skip
        """Queue a training request of ``body``'s model as its ``seq_id``: ``prepare(model)``
        checks the request and returns the operation; a refusal still takes the place."""
        fields = Fields(body, route)
        model_id = check_model_id(body.get("model_id"), f"{route}.model_id")
        seq = fields.integer("seq_id", high=MAX_SEQ)
        _, model = self.model(model_id)
        first = self.worker.seen(model_id, seq)
        if first is not None:  # a retry: the first answer
            return {"request_id": first, "model_id": model_id}
        try:
            operation = prepare(model)
        except WireError as exc:
            if not isinstance(exc, Busy):
                self.worker.refuse(model_id, seq, exc)
            raise
        return {"request_id": self.worker.run_in_order(model_id, seq, operation),
                "model_id": model_id}  # fmt: skip

    def _lora(self, base: Path, lora: Fields) -> LoraSpec:
        # a LoRA wider than the hidden size adds parameters and no rank
        hidden = getattr(self.configs[base], "hidden_size", None)
        return LoraSpec(
            rank=lora.integer("rank", 32, low=1, high=int(hidden) if hidden else MAX_INT32),
            train_attn=lora.flag("train_attn", True), train_mlp=lora.flag("train_mlp", True),
            train_unembed=lora.flag("train_unembed", True),
            seed=lora.integer("seed", None, high=2**63 - 1),
        )  # fmt: skip

    def _metadata(self, fields: Fields) -> dict[str, Any]:
        metadata = fields.body.get("user_metadata") or {}
        size = len(json.dumps(metadata)) if isinstance(metadata, dict) else -1
        if not 0 <= size <= self.limits.max_metadata_bytes:
            raise fields.fail("user_metadata", metadata, "a JSON object of at most "
                              f"{self.limits.max_metadata_bytes} bytes (max_metadata_bytes)")  # fmt: skip
        return metadata

    def _new_model_id(self, fields: Fields) -> str:
        session = fields.text("session_id", pattern=SESSION_ID)
        return f"{session}:train:{fields.integer('model_seq_id', high=MAX_ID_NUMBER)}"

    def _register(self, model_id: str, base: str, spec: LoraSpec, metadata: dict) -> TrainingModel:
        directory = self.base_dir(base)
        model = TrainingModel(directory, spec, tokenizer=self.tokenizers[directory],
                              precision=self.served[directory].precision, device=self.device)  # fmt: skip
        with self._lock:
            self.models[model_id] = (base, model)
        record = {"base_model": base, "lora": spec.__dict__, "user_metadata": metadata,
                  "created": iso(time.time())}  # fmt: skip
        self.store.write_run(model_id, record)
        return model

    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        fields = Fields(body, "create_model")
        model_id = self._new_model_id(fields)
        base = fields.text("base_model")
        spec = self._lora(self.base_dir(base), fields.nested("lora_config"))
        optimizer = fields.nested("optimizer_config").text("type", "adamw")
        if optimizer != "adamw":
            raise WireError(f"optimizer_config.type {optimizer!r} is not served (only adamw)")
        metadata = self._metadata(fields)

        def create() -> dict[str, Any]:
            self._register(model_id, base, spec, metadata)
            return {"type": "create_model", "model_id": model_id}

        return self._create_once(model_id, create)

    def _create_once(self, model_id: str, create) -> dict[str, Any]:
        """Queue a model's creation; a retried creation gets the first one's answer."""
        with self._lock:
            if model_id in self._created:
                return self._created[model_id]
            self.worker.start_model(model_id)
            answer = {"request_id": self.worker.run(create), "model_id": model_id}
            self._created[model_id] = answer
        return answer

    def get_info(self, body: dict[str, Any]) -> dict[str, Any]:
        base, model = self.model(Fields(body, "get_info").body.get("model_id"))
        return {
            "type": "get_info", "model_id": body["model_id"], "is_lora": True,
            "lora_rank": model.spec.rank, "optimizer_config": {"type": "adamw"},
            # the directory, not the name: the SDK loads tokenizers from model_name too
            "model_data": {"arch": model.policy.config.model_type,
                           "model_name": str(model.base_dir), "tokenizer_id": str(model.base_dir)},
        }  # fmt: skip

    def forward_backward(self, body: bytes) -> dict[str, Any]:
        message = parse_forward_backward(body)
        fields = {"model_id": message.model_id, "seq_id": message.seq_id}

        def prepare(model: TrainingModel):
            call = forward_backward_call(message)
            rows = model.checked(call)
            return lambda: ("proto", forward_backward_output(*model.forward_backward(call, rows)))

        return self._in_order(fields, "forward_backward", prepare)

    def optim_step(self, body: dict[str, Any]) -> dict[str, Any]:
        def prepare(model: TrainingModel):
            if body.get("optimizer_params") is not None:
                raise WireError("optimizer_params (non-Adam optimizers) are not served: use "
                                "AdamParams")  # fmt: skip
            params = adam_params(body.get("adam_params") or {})

            def step() -> dict[str, Any]:
                metrics = model.optim_step(params)
                print(f"ardea tinker: {body['model_id']} step {model.steps}: loss "
                      f"{metrics['loss']:.6g} (summed since the last step), grad_norm "
                      f"{metrics['grad_norm']:.4g}, lr {metrics['learning_rate']:g}",
                      file=sys.stderr, flush=True)  # fmt: skip
                return {"type": "optim_step", "metrics": metrics}

            return step

        return self._in_order(body, "optim_step", prepare)

    # -- saving and loading ----------------------------------------------------------
    def save_state(self, body: dict[str, Any]) -> dict[str, Any]:
        def prepare(model: TrainingModel):
            fields = Fields(body, "save_weights")
            path = self.store.new_path(body["model_id"], "weights", body.get("path"))
            exists = self.store.directory(path).exists()
            if exists and not fields.flag("overwrite", False):
                raise WireError(f"{path} exists already; save_state(..., overwrite=True) "
                                "replaces it")  # fmt: skip

            def save() -> dict[str, Any]:
                self.store.save(path, model.save_state)
                return {"type": "save_weights", "path": str(path)}

            return save

        return self._in_order(body, "save_weights", prepare)

    def save_for_sampler(self, body: dict[str, Any]) -> dict[str, Any]:
        def prepare(model: TrainingModel):
            fields = Fields(body, "save_weights_for_sampler")
            base, model_id = self.models[body["model_id"]][0], body["model_id"]
            kind = fields.text("kind", "snapshot")
            if kind not in ("snapshot", "inflight"):
                raise fields.fail("kind", kind, "snapshot or inflight")
            if body.get("path") is None:  # save_weights_and_get_sampling_client: in memory
                seq = fields.integer("sampling_session_seq_id", high=MAX_ID_NUMBER)
                session = f"{model_id.split(':')[0]}:sample:{seq}"
                publish = self._inflight if kind == "inflight" else self._snapshot
                return lambda: publish(model, model_id, base, session)
            if kind == "inflight":
                raise WireError("an inflight save_weights_for_sampler takes no path")
            path = self.store.new_path(model_id, "sampler_weights", body["path"])

            def save() -> dict[str, Any]:
                self.store.save(path, lambda tmp: save_policy(model.policy, model.tokenizer, tmp))
                source = ("adapters", model, model.adapter_state())
                self.sampling.replace(str(path), (base, str(path), source))
                self.engines.forget(self.served[self.base_dir(base)], str(path))
                return {"type": "save_weights_for_sampler", "path": str(path)}

            return save

        return self._in_order(body, "save_weights_for_sampler", prepare)

    def _snapshot(self, model: TrainingModel, model_id: str, base: str, session: str):
        key = f"{model_id}@{model.steps}#{session}"
        self.sampling.open(session, (base, key, ("adapters", model, model.adapter_state())))
        return {"type": "save_weights_for_sampler", "sampling_session_id": session}

    def _inflight(self, model: TrainingModel, model_id: str, base: str, session: str):
        """The SDK's ``kind="inflight"``: every inflight session of ``model_id`` samples one
        set of weights, which this save replaces with the current ones (on the worker
        thread: no training step is running)."""
        key, state = f"{model_id}@inflight", model.adapter_state()
        with self._lock:
            published = self.published.get(model_id)
            if fresh := published is None:
                published = self.published[model_id] = Published(state)
        published.adapters = state
        source = ("inflight", model, published)
        self.sampling.open(session, (base, key, source))
        if not fresh:
            served = self.served[self.base_dir(base)]
            self.engines.publish(self.sampling.cache.peek(key), served, key, source)
        return {"type": "save_weights_for_sampler", "sampling_session_id": session}

    def load_state(self, body: dict[str, Any]) -> dict[str, Any]:
        """``load_state`` into a model, or (no ``model_id``) a new model from a saved state."""
        fields = Fields(body, "load_weights")
        with_optimizer = fields.flag("optimizer", False)
        if body.get("model_id"):

            def prepare(model: TrainingModel):
                parsed, directory = self.store.existing(body.get("path"))
                if parsed.kind != "weights":
                    raise WireError(f"{body['path']} holds sampler weights: load a save_state path")
                return lambda: self._load(model, directory, body, with_optimizer, body["model_id"])

            return self._in_order(body, "load_weights", prepare)
        model_id = self._new_model_id(fields)
        parsed, directory = self.store.existing(body.get("path"))
        if parsed.kind != "weights":
            raise WireError(f"{body['path']} holds sampler weights: load a save_state path")
        run = self.store.run(parsed.model_id)
        base = fields.text("base_model", None) or run["base_model"]
        spec = self._lora(self.base_dir(base), Fields(run["lora"], "run.json lora"))
        metadata = self._metadata(fields) or run.get("user_metadata") or {}

        def create() -> dict[str, Any]:
            model = self._register(model_id, base, spec, metadata)
            return self._load(model, directory, body, with_optimizer, model_id)

        return self._create_once(model_id, create)

    def _load(self, model, directory, body, with_optimizer, model_id: str) -> dict[str, Any]:
        model.load_state(directory, optimizer=with_optimizer)
        return {"type": "load_weights", "path": body["path"], "model_id": model_id}

    # -- sampling sessions -----------------------------------------------------------
    def create_sampling_session(self, body: dict[str, Any]) -> dict[str, Any]:
        fields = Fields(body, "create_sampling_session")
        session = fields.text("session_id", pattern=SESSION_ID)
        session += f":sample:{fields.integer('sampling_session_seq_id', high=MAX_ID_NUMBER)}"
        if body.get("model_path"):
            path = fields.text("model_path", max_length=512)
            entry = self.sampling.from_path(path, lambda m: self.store.run(m)["base_model"])
        else:
            base = fields.text("base_model", None)
            if not base:
                raise WireError("create_sampling_session needs a model_path or a base_model")
            directory = self.base_dir(base)
            entry = (base, f"base:{directory}", ("directory", directory))
        self.sampling.open(session, entry)
        return {"type": "create_sampling_session", "sampling_session_id": session}

    def sampler_info(self, session: str) -> dict[str, Any]:
        base, key, _ = self.sampling.entry(check_sampling_id(session, "sampler id"))
        path = key if key.startswith("tinker://") else None
        return {"sampler_id": session, "base_model": str(self.base_dir(base)), "model_path": path}

    def _sampler(self, entry: tuple[str, str, Any]) -> Sampler:
        """The sampler of a sampling session's weights (:mod:`tinker_engines`)."""
        base, key, source = entry
        return self.engines.sampler(self.served[self.base_dir(base)], key, source)

    def asample(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.sampling.asample(body)

    # -- the REST side ----------------------------------------------------------------
    def training_run(self, model_id: str) -> dict[str, Any]:
        run = self.store.run(model_id)
        saved = self.store.checkpoints(model_id)
        last = {kind: [c for c in saved if c["checkpoint_type"] == kind] for kind in KINDS.values()}
        return {
            "training_run_id": model_id, "base_model": run["base_model"], "model_owner": "local",
            "is_lora": True, "lora_rank": run["lora"]["rank"], "corrupted": False,
            "last_request_time": iso(time.time()), "user_metadata": run.get("user_metadata"),
            "last_checkpoint": (last["training"] or [None])[-1],
            "last_sampler_checkpoint": (last["sampler"] or [None])[-1],
        }  # fmt: skip

    def weights_info(self, body: dict[str, Any]) -> dict[str, Any]:
        path = TinkerPath.parse(Fields(body, "weights_info").body.get("tinker_path"), "tinker_path")
        run = self.store.run(path.model_id)
        lora = run["lora"]
        return {"base_model": run["base_model"], "is_lora": True,
                "lora_rank": lora["rank"], "train_mlp": lora["train_mlp"],
                "train_attn": lora["train_attn"], "train_unembed": lora["train_unembed"]}  # fmt: skip

    def close(self) -> None:
        self.worker.close()
        self.sampling.close()
        self.engines.close()
