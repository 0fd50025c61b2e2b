"""The default generation engine: continuous batching with a KV cache on a Hugging Face
causal LM.

Notation: ``N`` rows being decoded (prompts × n samples), ``T`` ``max_new_tokens``, ``V``
vocabulary.

Requests (:meth:`InProcessEngine.submit`, one row each; :meth:`~InProcessEngine.generate`
submits a batch's rows at once and waits for them) wait in a queue and are decoded one step
at a time (:mod:`ardea.rollout.engines.inprocess.step_loop`: by a scheduler thread, or by a batch call in its
own thread). Before every decode step waiting rows join (up to ``max_batch_size`` rows per
kind of sampling, :class:`~ardea.rollout.engines.inprocess.continuous.Kind`): they are prefilled together and
their KV cache merged into the running rows' (:mod:`ardea.rollout.engines.inprocess.decode_batch`), then every
running row samples one token. A row that ends (stop token, stop string,
``max_new_tokens``) leaves at once and its handle is done, so a long completion holds back no
other request. The model's layers must allow merging caches (the preallocated layers of
:mod:`ardea.rollout.engines.inprocess.kv_cache`); otherwise rows join only a kind with nothing running.

Log-probs (behaviour log-probs): for ``T > 0`` the log-prob of the sampled token under the
distribution it was drawn from, ``log_softmax(logits / T)`` renormalised over the top-k /
top-p kept set, and over the non-stop tokens while stop tokens are suppressed
(``min_new_tokens``). They equal what the trainer recomputes on the same tokens and weights
(``log_softmax(logits / T)`` over the same top-k / top-p set, the batch's
``TrajectoryBatch.sampling()``), except at the first ``min_new_tokens`` tokens, where the
engine's is higher by ``−log(1 − p_stop)`` (the stop tokens' mass;
:mod:`ardea.rollout.engines.inprocess.sampling`); with greedy (``T = 0``) they are ``log_softmax(logits)``
(temperature 1).

Weights (:meth:`InProcessEngine.update_weights`) change between two decode steps, never
waiting for running requests: those stop, the weights load, the version is published, and
they join again with their tokens so far as input, so their cache is recomputed under the
new weights and their next tokens are labelled with the new version (a new span of
``Completion.spans``). :meth:`~InProcessEngine.abort` hands out the tokens so far the same
way. During a decode step the model is in eval mode (each submodule's own mode is restored
after), so a model shared with the trainer must not be trained while requests run.

Randomness: a row draws its position-``t`` uniform from entry ``(row_id, t)`` of a
``(rows, T)`` table made by a ``torch.Generator`` seeded with ``params.seed`` (the global RNG
when seed is None: drawn when the row is submitted). A row's tokens therefore depend only on
its prompt, the seed, its row id and the weights of each position, not on which rows it was
decoded with, when it joined, or whether it was stopped and resumed.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from ardea.model import Precision
from ardea.model.autocast_experts import follow_autocast, forget_casts, keep_casts
from ardea.model.flops import count_decode, count_prefill
from ardea.rollout.checks import frozen_base, request_input, whole
from ardea.rollout.engine import (
    Completion,
    EngineSpec,
    GenerationEngine,
    Request,
    RequestHandle,
    SamplingParams,
    Weights,
    check_next_version,
    check_prompts,
    check_state_dict,
    load_weights,
    register_engine,
)
from ardea.rollout.engines.inprocess.continuous import (
    Decoder,
    additive_mask_dtype,
    request_tables,
    take_joining,
    uniform_table,
)
from ardea.rollout.engines.inprocess.decode_batch import DecodeBatch, Kind, Row
from ardea.rollout.engines.inprocess.fast_decode import fast_decoder
from ardea.rollout.engines.inprocess.kv_cache import can_merge
from ardea.rollout.engines.inprocess.step_loop import StepLoop


class InProcessEngine(GenerationEngine):
    """Generate with ``model`` in this process (see the module docstring for the algorithm).

    Args:
        model: a Hugging Face causal LM (``AutoModelForCausalLM``); the engine generates with
            this module and loads new weights into it (:meth:`update_weights`). Build it on a
            copy (:func:`own_copy`) to own the weights; on the trainer's own module (same
            device) the engine shares its storage, the fast path of :meth:`update_weights`.
        pad_token_id: id fed for ended rows and used for left padding.
        eos_token_ids: the model's end-of-sequence id(s); always stop tokens (may be empty).
        max_batch_size: most rows decoded together per kind of sampling; None = no limit.
            A batch call submits its rows shortest prompt first, so rows that join together
            need less padding.
        version: policy version of the initial weights.
        precision: forwards run under its autocast (:class:`ardea.model.Precision`); None
            computes in the parameters' dtype.
        tokenizer: decodes rows for stop strings (``SamplingParams.stop``:
            :mod:`ardea.rollout.engines.inprocess.stop_watch`); None refuses calls that give them.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_token_id: int,
        eos_token_ids: int | Sequence[int],
        max_batch_size: int | None = None,
        version: int = 0,
        precision: Precision | None = None,
        tokenizer: Any = None,
    ) -> None:
        self._model = model
        self.tokenizer = tokenizer
        self._vocab_size = int(model.get_input_embeddings().num_embeddings)
        self._max_context = getattr(model.config, "max_position_embeddings", None)
        eos = [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids)
        for name, tok in [("pad_token_id", pad_token_id)] + [
            (f"eos_token_ids[{i}]", t) for i, t in enumerate(eos)
        ]:
            if not isinstance(tok, int) or not 0 <= tok < self._vocab_size:
                raise ValueError(f"{name} must be an int in [0, {self._vocab_size}), got {tok!r}")
        if max_batch_size is not None and (
            not isinstance(max_batch_size, int) or max_batch_size < 1
        ):
            raise ValueError(f"max_batch_size must be None or an int >= 1, got {max_batch_size!r}")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}")
        self.pad_token_id = pad_token_id
        self.eos_token_ids = eos
        self._stop_token_ids = tuple(eos)
        self.max_batch_size = max_batch_size
        self._version = version
        self._precision = precision
        params = inspect.signature(model.forward).parameters
        follow_autocast(model)  # its experts computed as the trainer's (in the compute dtype)
        mask_dtype = additive_mask_dtype(model)
        compute = precision.compute if precision is not None else None
        self._fast = fast_decoder(model, compute) if mask_dtype is not None else None
        self._decoder = Decoder(
            model, self._fast, mask_dtype, pad_token_id,
            "cache" if "cache" in params else "past_key_values",
            "logits_to_keep" in params, tokenizer,
        )  # fmt: skip
        self._merge_ok: bool | None = None  # learnt from the first cache built
        self._frozen = frozen_base(model)  # a LoRA policy's base: syncs may leave it out
        self._batches: dict[Kind, DecodeBatch] = {}
        self._loop = StepLoop(self._take, self._iterate, lambda: bool(self._batches), self._fail)

    # ------------------------------------------------------------------ requests
    def submit(self, request: Request) -> RequestHandle:
        """Queue ``request`` (module docstring); its handle is done when it ends."""
        return self.submit_all([request])[0]

    def submit_all(self, requests: Sequence[Request]) -> list[RequestHandle]:
        """Queue ``requests`` at once: they join the same decode step (module docstring)."""
        for request in requests:
            ids, left = request_input(request)
            self._check([ids], left)
        rows = self._rows(list(requests), None)
        self._loop.enqueue(rows)
        return [row.handle for row in rows]

    def wait(self, handles: Sequence[RequestHandle]) -> list[Completion]:
        """The completions of ``handles``, decoding in the calling thread until they are done
        (with every other running request: :meth:`StepLoop.drive`)."""
        self._loop.drive(list(handles))
        return [h.result() for h in handles]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Complete every prompt ``params.n`` times; see the module docstring.

        Returns ``len(prompts) * n`` completions, prompt-major (prompt 0's n samples first).
        An empty ``prompts`` returns [].
        """
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        self._check(prompts, params.max_new_tokens)
        if len(prompts) == 0:
            return []
        inputs = [list(p) for p in prompts for _ in range(params.n)]
        row_ids = params.rows(len(inputs))
        requests = [Request(p, params, row) for p, row in zip(inputs, row_ids)]
        rows = self._rows(requests, uniform_table(len(inputs), params))
        order = list(range(len(rows)))
        if self.max_batch_size is not None and self.max_batch_size < len(rows):
            order.sort(key=lambda r: len(inputs[r]))  # similar lengths join together
        self._loop.enqueue([rows[r] for r in order], drive=True)
        self._loop.drive([row.handle for row in rows])
        return [row.handle.result() for row in rows]

    def abort(self, handles: Sequence[RequestHandle]) -> list[Completion]:
        """Stop the requests of ``handles`` before the next decode step; per handle its
        finished completion, or the tokens so far (``finish_reason`` "abort")."""
        with self._loop.exclusively():
            wanted = {id(h) for h in handles if not h.done()}
            stopped = [r for r in self._loop.waiting if id(r.handle) in wanted]
            self._loop.waiting = [r for r in self._loop.waiting if id(r.handle) not in wanted]
            for kind, batch in list(self._batches.items()):
                batch.fold()
                running = batch.running().tolist()
                stopped += [batch.rows[i] for i in running if id(batch.rows[i].handle) in wanted]
                self._keep(
                    kind, batch, [i for i in running if id(batch.rows[i].handle) not in wanted]
                )
            for row in stopped:
                row.handle.finish(row.completion("abort", self._version))
        return [h.result() for h in handles]

    def update_weights(self, weights: Weights, version: int) -> None:
        """Load ``weights`` and publish ``version`` between two decode steps; running
        requests go on under them from their tokens so far (module docstring).

        ``weights`` (a state dict, or a directory of ``*.safetensors`` files) must hold
        every tensor of the model the model trains (tied aliases may be omitted; a LoRA
        policy's frozen base may be too, so that a sync moves its adapter alone) with
        matching shapes; it is checked before anything is copied, so a bad one leaves
        weights and version untouched.
        ``version`` must be greater than the current one: a version names one set of
        weights. Fast path: a tensor that already is the engine's own (an engine built on
        the trainer's module) is not copied, so publishing costs only the check.
        """
        named_tensors = load_weights(weights)
        with self._loop.exclusively():
            check_next_version(version, self._version)
            own = self._model.state_dict()
            check_state_dict(own, named_tensors, frozen=self._frozen)
            running: list[Row] = []
            for batch in self._batches.values():
                batch.fold()
                running += [batch.rows[i] for i in batch.running().tolist()]
            for watch in self._decoder.watches.values():
                watch.forget(running)
            if self.in_flight == "restart":  # verl's choice: one version per completion
                for row in running:
                    row.restart()
            self._batches.clear()
            self._loop.waiting = (
                running + self._loop.waiting
            )  # they join first, under the new weights
            with torch.no_grad():
                for name, tensor in named_tensors.items():  # a shard: gathered here
                    if isinstance(tensor, DTensor) or own[name].data_ptr() != tensor.data_ptr():
                        own[name].copy_(whole(tensor))
            forget_casts(self._model)
            if self._fast is not None:
                self._fast.refresh()
            self._version = version

    def close(self) -> None:
        """Stop the scheduler; requests not done fail."""
        with self._loop.exclusively():
            self._loop.closed = True
            rows = self._loop.waiting + [r for b in self._batches.values() for r in b.rows]
            self._loop.waiting, self._batches = [], {}
        for row in rows:
            row.handle.finish(None, RuntimeError("the generation engine was closed"))

    # ------------------------------------------------------------------ scheduling
    def _check(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        check_prompts(prompts, vocab_size=self._vocab_size, max_new_tokens=max_new_tokens,
                      max_positions=self._max_context)  # fmt: skip

    def _rows(self, requests: list[Request], table: torch.Tensor | None) -> list[Row]:
        """Rows for checked ``requests``, with their random numbers: row ``i`` of ``table``
        (a batch call's), or, when None, their own (:func:`request_tables`)."""
        tables = request_tables(requests) if table is None else None
        rows, kind, params = [], None, None
        for i, request in enumerate(requests):
            if request.params is not params:  # a batch call's rows share one params
                params = request.params
                kind = Kind.of(params, self.eos_token_ids)
            at, index = (table, i) if tables is None else tables[i]
            rows.append(Row(RequestHandle(request), kind=kind, table=at, table_row=index))
        return rows

    def _take(self, waiting: list[Row]) -> tuple[list[Row], list[Row]]:
        return take_joining(waiting, self._batches, self.max_batch_size, self._merge_ok)

    def _fail(self, joining: list[Row], error: BaseException) -> None:
        rows = joining + [r for b in self._batches.values() for r in b.rows]
        self._batches = {}
        for row in rows:
            row.handle.finish(None, error)

    def _iterate(self, joining: list[Row]) -> None:
        """Let ``joining`` in, then one decode step of every kind (module docstring)."""
        autocast = self._precision.autocast() if self._precision else contextlib.nullcontext()
        with torch.inference_mode(), autocast, keep_casts():  # dropped at update_weights
            by_kind: dict[Kind, list[Row]] = {}
            for row in joining:
                by_kind.setdefault(row.kind, []).append(row)
            for kind, rows in by_kind.items():
                self._count_joining(rows)
                fresh = self._decoder.prefill(rows, self._version)
                if self._merge_ok is None:
                    self._merge_ok = can_merge(fresh.cache)
                old = self._batches.get(kind)
                self._batches[kind] = fresh if old is None else old.join(fresh)
            for kind, batch in list(self._batches.items()):
                for row, finish in self._decoder.step(batch, kind):
                    self._count_decoded(row)
                    row.handle.finish(row.completion(finish, self._version))
                if batch.n_alive == 0:
                    del self._batches[kind]

    def _count_joining(self, rows: list[Row]) -> None:
        """Count the prefill of rows joining (and the decode steps a re-joining row ran):
        generation's FLOPs, whichever call (batch, request, agent) brought the rows."""
        for row in rows:
            self._count_decoded(row)
            row.joined = len(row.input_ids)
        count_prefill(self._model, [row.input_ids for row in rows])

    def _count_decoded(self, row: Row) -> None:
        if row.joined:  # the first token comes from the prefill's logits
            count_decode(self._model, len(row.input_ids) - row.joined - 1, row.joined)

    def _keep(self, kind: Kind, batch: DecodeBatch, keep: list[int]) -> None:
        """Keep only rows ``keep`` of ``kind``'s batch (none: the batch goes)."""
        if not keep:
            del self._batches[kind]
        elif len(keep) < len(batch.rows):
            batch.select(torch.tensor(keep, device=batch.count.device))


def own_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of ``module`` in eval mode, for an engine that owns its weights (one
    generating in a background thread while the original trains)."""
    return copy.deepcopy(module).requires_grad_(False).eval()


@register_engine("in_process", per_process=True)
def in_process_engine(
    spec: EngineSpec, *, module: torch.nn.Module | None = None, version: int = 0
) -> InProcessEngine:
    """The in-process engine generating with ``module`` (shared, not copied), or with the
    model loaded from ``spec.model_dir`` when no module is given; ``spec.options`` may hold
    ``max_batch_size`` (rows decoded together per kind of sampling; None: no limit)."""
    unknown = sorted(set(spec.options) - {"max_batch_size"})
    if unknown:
        raise ValueError(f"the in_process engine has no options {unknown} (max_batch_size)")
    if module is None:
        if spec.model_dir is None:
            raise ValueError(
                "the in_process engine needs a module or a spec.model_dir to load one from"
            )
        module = AutoModelForCausalLM.from_pretrained(spec.model_dir).requires_grad_(False)
    return InProcessEngine(
        module,
        pad_token_id=spec.tokenizer.pad_token_id,
        eos_token_ids=list(spec.stop_token_ids),
        max_batch_size=spec.options.get("max_batch_size"),
        version=version,
        precision=spec.precision,
        tokenizer=spec.tokenizer,
    )
