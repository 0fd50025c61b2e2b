"""The Tinker API's operations on ardea's parts, without HTTP (:mod:`tinker_app` serves them).

Sessions and ids follow the SDK: a session ``s-<n>``, models ``<session>:train:<k>``,
sampling sessions ``<session>:sample:<k>``. Training operations (create, forward_backward,
optim_step, saves, loads) run on one worker thread, each model's in ``seq_id`` order
(:mod:`tinker_futures`); sampling is decoded by in-process engines, one per set of sampler
weights (:mod:`tinker_sampler`). Base models are local directories served under the names
given at start (and their paths).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ardea.model.loading import check_model_dir, load_tokenizer
from ardea.model.lora import POLICY_DIR, save_policy
from ardea.service.tinker_futures import Futures, Worker
from ardea.service.tinker_model import LoraSpec, TrainingModel
from ardea.service.tinker_sampler import UNSUPPORTED_SAMPLING, Sampler, SamplerCache
from ardea.service.tinker_store import KINDS, Store, TinkerPath, iso
from ardea.service.tinker_wire import (
    WireError,
    forward_backward_output,
    read_forward_backward,
    sample_response,
)
from ardea.trainer.setup import resolve_device


def _plain_model(directory: Path, device: torch.device):
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    return model.to(device).requires_grad_(False).eval()


class TinkerService:
    """The server's state: base models, sessions, trained models, samplers, futures."""

    def __init__(
        self, bases: dict[str, Path], state_dir: Path, *, samplers: int = 3, device: str = "cpu"
    ) -> None:
        if not bases:
            raise WireError("the Tinker server needs at least one base model directory")
        self.bases = {name: check_model_dir(path).resolve() for name, path in bases.items()}
        self.tokenizers = {path: load_tokenizer(path) for path in set(self.bases.values())}
        self.device = resolve_device(device)
        self.store = Store(state_dir)
        self.futures = Futures()
        self.worker = Worker(self.futures)
        self.samplers = SamplerCache(samplers)
        self.models: dict[str, tuple[str, TrainingModel]] = {}  # id -> (base name, model)
        self.sampling: dict[str, tuple[str, str, Any]] = {}  # id -> (base, path, source)
        self._sessions = itertools.count(1)
        self._asked: dict[tuple[str, Any], dict[str, Any]] = {}  # asample retries
        self._created: dict[str, dict[str, Any]] = {}  # create retries
        self._lock = threading.Lock()
        self.started = time.time()

    # -- names -----------------------------------------------------------------------
    def base_dir(self, name: str) -> Path:
        if name in self.bases:
            return self.bases[name]
        as_path = Path(name).expanduser()
        if as_path.is_dir() and as_path.resolve() in self.tokenizers:
            return as_path.resolve()
        raise WireError(f"unknown base_model {name!r}; served: {', '.join(sorted(self.bases))}")

    def model(self, model_id: str) -> tuple[str, TrainingModel]:
        with self._lock:
            found = self.models.get(model_id)
        if found is None:
            raise WireError(f"unknown model_id {model_id!r}: create it first")
        return found

    def new_session(self) -> str:
        return f"s{int(self.started)}-{next(self._sessions)}"

    def capabilities(self) -> dict[str, Any]:
        models = []
        for name, path in sorted(self.bases.items()):
            config = AutoConfig.from_pretrained(path, local_files_only=True)
            models.append({"model_name": name, "trainable": True, "sampleable": True,
                           "max_context_length": getattr(config, "max_position_embeddings", None)})  # fmt: skip
        return {"supported_models": models}

    # -- training models -------------------------------------------------------------
    def _register(self, model_id: str, base: str, spec: LoraSpec, metadata: dict) -> TrainingModel:
        directory = self.base_dir(base)
        model = TrainingModel(directory, spec, tokenizer=self.tokenizers[directory],
                              device=self.device)  # fmt: skip
        with self._lock:
            self.models[model_id] = (base, model)
        record = {"base_model": base, "lora": spec.__dict__, "user_metadata": metadata,
                  "created": iso(time.time())}  # fmt: skip
        self.store.write_run(model_id, record)
        return model

    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"
        lora = body.get("lora_config") or {}
        spec = LoraSpec(
            rank=int(lora.get("rank", 32)), train_attn=bool(lora.get("train_attn", True)),
            train_mlp=bool(lora.get("train_mlp", True)),
            train_unembed=bool(lora.get("train_unembed", True)), seed=lora.get("seed"),
        )  # fmt: skip
        if spec.rank < 1:
            raise WireError(f"lora_config.rank must be >= 1, got {spec.rank}")
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise WireError(f"optimizer_config.type {optimizer!r} is not served (only adamw)")
        base = body["base_model"]
        self.base_dir(base)  # an unknown name fails the request itself, not only its future

        def create() -> dict[str, Any]:
            self._register(model_id, base, spec, body.get("user_metadata") or {})
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
        base, model = self.model(body["model_id"])
        return {
            "type": "get_info", "model_id": body["model_id"], "is_lora": True,
            "lora_rank": model.spec.rank, "optimizer_config": {"type": "adamw"},
            # the directory, not the name: the SDK loads tokenizers from model_name too
            "model_data": {"arch": model.policy.config.model_type,
                           "model_name": str(model.base_dir), "tokenizer_id": str(model.base_dir)},
        }  # fmt: skip

    def forward_backward(self, body: bytes, encoding: str | None) -> dict[str, Any]:
        call = read_forward_backward(body, encoding)
        _, model = self.model(call.model_id)

        def step() -> tuple[str, bytes]:
            return "proto", forward_backward_output(*model.forward_backward(call))

        return {"request_id": self.worker.run_in_order(call.model_id, call.seq_id, step),
                "model_id": call.model_id}  # fmt: skip

    def optim_step(self, body: dict[str, Any]) -> dict[str, Any]:
        model_id = body["model_id"]
        _, model = self.model(model_id)
        if body.get("optimizer_params") is not None:
            raise WireError("optimizer_params (non-Adam optimizers) are not served: use AdamParams")
        adam = body.get("adam_params") or {}

        def step() -> dict[str, Any]:
            metrics = model.optim_step(adam)
            print(f"ardea tinker: {model_id} step {model.steps}: loss {metrics['loss']:.6g} "
                  f"(summed since the last step), grad_norm {metrics['grad_norm']:.4g}, "
                  f"lr {metrics['learning_rate']:g}", file=sys.stderr, flush=True)  # fmt: skip
            return {"type": "optim_step", "metrics": metrics}

        return {"request_id": self.worker.run_in_order(model_id, body["seq_id"], step),
                "model_id": model_id}  # fmt: skip

    # -- saving and loading ----------------------------------------------------------
    def save_state(self, body: dict[str, Any]) -> dict[str, Any]:
        model_id = body["model_id"]
        _, model = self.model(model_id)
        path = self.store.new_path(model_id, "weights", body["path"])
        directory = self.store.directory(path)
        if directory.exists() and not body.get("overwrite"):
            raise WireError(f"{path} exists already; save_state(..., overwrite=True) replaces it")

        def save() -> dict[str, Any]:
            model.save_state(directory)
            return {"type": "save_weights", "path": str(path)}

        return {"request_id": self.worker.run_in_order(model_id, body["seq_id"], save),
                "model_id": model_id}  # fmt: skip

    def save_for_sampler(self, body: dict[str, Any]) -> dict[str, Any]:
        model_id = body["model_id"]
        base, model = self.model(model_id)
        name = body.get("path")

        def save() -> dict[str, Any]:
            adapters = model.adapter_state()
            source = ("adapters", model, adapters)
            if name is None:  # save_weights_and_get_sampling_client: in memory only
                session = f"{model_id.split(':')[0]}:sample:{body['sampling_session_seq_id']}"
                key = f"{model_id}@{model.steps}#{session}"
                with self._lock:
                    self.sampling[session] = (base, key, source)
                return {"type": "save_weights_for_sampler", "sampling_session_id": session}
            path = self.store.new_path(model_id, "sampler_weights", name)
            save_policy(model.policy, model.tokenizer, self.store.directory(path))
            with self._lock:
                self.sampling[str(path)] = (base, str(path), source)
            return {"type": "save_weights_for_sampler", "path": str(path)}

        return {"request_id": self.worker.run_in_order(model_id, body["seq_id"], save),
                "model_id": model_id}  # fmt: skip

    def load_state(self, body: dict[str, Any]) -> dict[str, Any]:
        """``load_state`` into a model, or (no ``model_id``) a new model from a saved state."""
        parsed, directory = self.store.existing(body["path"])
        if parsed.kind != "weights":
            raise WireError(f"{body['path']} holds sampler weights: load a save_state path")
        with_optimizer = bool(body.get("optimizer"))
        if body.get("model_id"):
            model_id = body["model_id"]
            _, model = self.model(model_id)

            def load() -> dict[str, Any]:
                model.load_state(directory, optimizer=with_optimizer)
                return {"type": "load_weights", "path": body["path"], "model_id": model_id}

            return {"request_id": self.worker.run_in_order(model_id, body["seq_id"], load),
                    "model_id": model_id}  # fmt: skip
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"
        run = self.store.run(parsed.model_id)
        base = body.get("base_model") or run["base_model"]
        self.base_dir(base)

        def create() -> dict[str, Any]:
            model = self._register(model_id, base, LoraSpec(**run["lora"]),
                                   body.get("user_metadata") or run.get("user_metadata") or {})  # fmt: skip
            model.load_state(directory, optimizer=with_optimizer)
            return {"type": "load_weights", "path": body["path"], "model_id": model_id}

        return self._create_once(model_id, create)

    # -- sampling sessions -----------------------------------------------------------
    def create_sampling_session(self, body: dict[str, Any]) -> dict[str, Any]:
        session = f"{body['session_id']}:sample:{body['sampling_session_seq_id']}"
        if body.get("model_path"):
            path = body["model_path"]
            with self._lock:
                known = self.sampling.get(path)
            if known is None:
                parsed, directory = self.store.existing(path)
                base = self.store.run(parsed.model_id)["base_model"]
                known = (base, path, ("directory", directory / POLICY_DIR))
            entry = known
        else:
            base = body.get("base_model")
            if not base:
                raise WireError("create_sampling_session needs a model_path or a base_model")
            entry = (base, f"base:{self.base_dir(base)}", ("directory", self.base_dir(base)))
        with self._lock:
            self.sampling[session] = entry
        return {"type": "create_sampling_session", "sampling_session_id": session}

    def sampler_info(self, session: str) -> dict[str, Any]:
        base, key, _ = self.sampling_entry(session)
        path = key if key.startswith("tinker://") else None
        return {"sampler_id": session, "base_model": str(self.base_dir(base)), "model_path": path}

    def sampling_entry(self, session: str) -> tuple[str, str, Any]:
        with self._lock:
            entry = self.sampling.get(session)
        if entry is None:
            raise WireError(f"unknown sampling_session_id {session!r}")
        return entry

    def sampler(self, session: str) -> Sampler:
        """The engine of a sampling session (built on the worker thread when new)."""
        base, key, source = self.sampling_entry(session)
        tokenizer = self.tokenizers[self.base_dir(base)]

        def build() -> Sampler:
            if source[0] == "adapters":
                module = self.worker.call(lambda: source[1].merged_copy(source[2]))
            else:
                module = _plain_model(source[1], self.device)
            return Sampler(module, tokenizer)

        return self.samplers.get(key, build)

    def asample(self, body: dict[str, Any]) -> dict[str, Any]:
        """Start ``num_samples`` completions of the prompt (with its log-probs when asked)."""
        for key in UNSUPPORTED_SAMPLING:
            if body.get(key) not in (None, 0, False):
                raise WireError(f"{key} is not served by ardea's Tinker server")
        prompt: list[int] = []
        for chunk in (body.get("prompt") or {}).get("chunks", []):
            if chunk.get("type", "encoded_text") != "encoded_text":
                raise WireError(
                    f"prompt chunk type {chunk.get('type')!r} is not served (text only)"
                )
            prompt.extend(int(t) for t in chunk["tokens"])
        n = int(body.get("num_samples", 1))
        session = body.get("sampling_session_id") or ""
        dedupe = (session, body.get("seq_id"))
        with self._lock:
            if dedupe in self._asked:
                return self._asked[dedupe]
        sampler = self.sampler(session)
        params = sampler.params(prompt, body.get("sampling_params") or {}, n)
        request_id, future = self.futures.new()
        scores = sampler.prompt_logprobs(prompt) if body.get("prompt_logprobs") else None

        def done(completions) -> None:
            rows = [(c.token_ids, c.logprobs, c.finish_reason == "stop") for c in completions]
            future.set_result(("proto", sample_response(rows, scores)))

        sampler.submit(prompt, params, done, future.set_exception)
        answer = {"request_id": request_id,
                  "sample_sequence_ids": [f"{request_id}:{i}" for i in range(n)]}  # fmt: skip
        with self._lock:
            self._asked[dedupe] = answer
            if len(self._asked) > 4096:  # keep the retries of requests whose results are kept
                self._asked = {k: v for k, v in self._asked.items()
                               if self.futures.get(v["request_id"]) is not None}  # fmt: skip
        return answer

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

    def weights_info(self, path: str) -> dict[str, Any]:
        run = self.store.run(TinkerPath.parse(path).model_id)
        lora = run["lora"]
        return {"base_model": run["base_model"], "is_lora": True, "lora_rank": lora["rank"],
                "train_mlp": lora["train_mlp"], "train_attn": lora["train_attn"],
                "train_unembed": lora["train_unembed"]}  # fmt: skip

    def close(self) -> None:
        self.worker.close()
        self.samplers.close()
