"""The default generation engine: batched KV-cache decoding on a Hugging Face causal LM.

Notation: ``N`` rows in a batch (prompts × n samples), ``P`` padded prompt length, ``T``
``max_new_tokens``, ``V`` vocabulary.

How a batch is decoded:
1. Prompts are left-padded to ``P``; ``attention_mask`` is 1 on real tokens and
   ``position_ids = cumsum(attention_mask) − 1`` (0 on padding), so every row sees exactly the
   positions it would see alone.
2. One prefill forward over ``(N, P)`` fills a ``DynamicCache`` (identical prompts, e.g. the
   n samples of one prompt, are prefilled once); then one forward per new token over
   ``(N, 1)`` with the cache, whose layers append into buffers preallocated for ``P + T``
   positions, and with 4D attention masks prepared once per batch.
3. Each step samples every row from its last logits (see :mod:`ardea.rollout.sampling`); for
   the first ``params.min_new_tokens`` steps the stop tokens are suppressed first. A row
   that emits a stop token, or a token that completes one of ``params.stop`` in its text
   (:mod:`ardea.rollout.stop_watch`), is finished: later outputs are padding, and once half
   of the rows
   are finished they are dropped from the batch and the cache. Decoding stops when every row
   is finished or after ``T`` tokens.

Log-probs (behaviour log-probs): for ``T > 0`` the log-prob of the sampled token under the
distribution it was drawn from, ``log_softmax(logits / T)`` renormalised over the top-k /
top-p kept set, and over the non-stop tokens while stop tokens are suppressed
(``min_new_tokens``). They equal what the trainer recomputes on the same tokens and weights
(``log_softmax(logits / T)`` over the same top-k / top-p set, the batch's
``TrajectoryBatch.sampling()``), except at the
first ``min_new_tokens`` tokens, where the engine's is higher by ``−log(1 − p_stop)`` (the
stop tokens' mass; :mod:`ardea.rollout.sampling`); with greedy (``T = 0``) they are
``log_softmax(logits)`` (temperature 1).

Concurrency: ``generate`` and ``update_weights`` hold one lock, so a call runs on one set of
weights and labels its completions with their version; an update waits for a running call.
During a call the model is in eval mode (each submodule's own mode is restored after), so a
model shared with the trainer must not be trained from another thread at the same time.

Randomness: row r of a call (prompt r // n, sample r % n) draws its step-t uniform from
row ``params.row_ids[r]`` (default ``r``) of a ``(rows, T)`` table made once per call by a
``torch.Generator`` seeded with ``params.seed`` (the global RNG when seed is None). A row's
tokens therefore depend only on its prompt, the seed and its row id, not on
``max_batch_size``, padding, the other prompts or how a rollout is split over calls.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import threading
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from ardea.model import Precision
from ardea.model.flops import count_generation
from ardea.rollout.decode_batch import DecodeMasks, DecodeOutputs, Result
from ardea.rollout.engine import (
    Completion,
    EngineSpec,
    GenerationEngine,
    SamplingParams,
    Weights,
    check_next_version,
    check_prompts,
    check_state_dict,
    load_weights,
    register_engine,
)
from ardea.rollout.fast_decode import fast_decoder
from ardea.rollout.kv_cache import new_cache
from ardea.rollout.sampling import next_tokens, suppress_tokens
from ardea.rollout.stop_watch import StopWatch

_COMPACT_MIN_ROWS = 8  # below this many rows, dropping finished rows is not worth a copy


class InProcessEngine(GenerationEngine):
    """Generate with ``model`` in this process (see the module docstring for the algorithm).

    Args:
        model: a Hugging Face causal LM (``AutoModelForCausalLM``); the engine generates with
            this module and loads new weights into it (:meth:`update_weights`). Build it on a
            copy (:func:`own_copy`) to own the weights; on the trainer's own module (same
            device) the engine shares its storage, the fast path of :meth:`update_weights`.
        pad_token_id: id written after a row's stop token and used for left padding.
        eos_token_ids: the model's end-of-sequence id(s); always stop tokens (may be empty).
        max_batch_size: most rows (prompts × n) per forward; None = all rows at once. Rows are
            sorted by prompt length before batching to reduce padding.
        version: policy version of the initial weights.
        precision: forwards run under its autocast (:class:`ardea.model.Precision`); None
            computes in the parameters' dtype.
        tokenizer: decodes rows for stop strings (``SamplingParams.stop``:
            :mod:`ardea.rollout.stop_watch`); None refuses calls that give them.
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
        self._max_positions = getattr(model.config, "max_position_embeddings", None)
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
        self.max_batch_size = max_batch_size
        self._version = version
        self._precision = precision
        self._lock = threading.Lock()
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._keep_last = "logits_to_keep" in params
        self._mask_dtype = _additive_mask_dtype(model)
        compute = precision.compute if precision is not None else None
        self._fast = fast_decoder(model, compute) if self._mask_dtype is not None else None

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int | None:
        """The model's ``max_position_embeddings`` (None when its config has none)."""
        return self._max_positions

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self.eos_token_ids)

    def update_weights(self, weights: Weights, version: int) -> None:
        """Load ``weights`` and publish ``version`` atomically (waits for a running
        generate).

        ``weights`` (a state dict, or a directory of ``*.safetensors`` files) must hold
        every tensor of the model (tied aliases may be omitted) with matching shapes; it is
        checked before anything is copied, so a bad one leaves weights and version untouched.
        ``version`` must be greater than the current one: a version names one set of
        weights. Fast path: a tensor that already is the engine's own (an engine built on
        the trainer's module) is not copied, so publishing costs only the check.
        """
        named_tensors = load_weights(weights)
        with self._lock:
            check_next_version(version, self._version)
            own = self._model.state_dict()
            check_state_dict(own, named_tensors)
            with torch.no_grad():
                for name, tensor in named_tensors.items():
                    if own[name].data_ptr() != tensor.data_ptr():
                        own[name].copy_(tensor)
            if self._fast is not None:
                self._fast.refresh()
            self._version = version

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Complete every prompt ``params.n`` times; see the module docstring.

        Returns ``len(prompts) * n`` completions, prompt-major (prompt 0's n samples first),
        all tagged with the version of the weights used. An empty ``prompts`` returns [].
        """
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        check_prompts(
            prompts,
            vocab_size=self._vocab_size,
            max_new_tokens=params.max_new_tokens,
            max_positions=self._max_positions,
        )
        if len(prompts) == 0:
            return []
        rows = [list(p) for p in prompts for _ in range(params.n)]
        with self._lock:
            version = self._version
            uniforms = _uniform_table(len(rows), params)
            autocast = self._precision.autocast() if self._precision else contextlib.nullcontext()
            with _eval_mode(self._model), torch.inference_mode(), autocast:
                results = self._generate_rows(rows, params, uniforms)
        count_generation(self._model, prompts, rows, [len(result[0]) for result in results])
        return [Completion(p, *result, version) for p, result in zip(rows, results, strict=True)]

    def _generate_rows(
        self, rows: list[list[int]], params: SamplingParams, uniforms: torch.Tensor | None
    ) -> list[Result]:
        """Decode all rows in batches of ``max_batch_size``; results in the order of ``rows``."""
        size = self.max_batch_size or len(rows)
        order = list(range(len(rows)))
        if size < len(rows):
            order.sort(key=lambda r: len(rows[r]))  # similar lengths together: less padding
        results: list = [None] * len(rows)
        for start in range(0, len(rows), size):
            idx = order[start : start + size]
            u = uniforms[idx] if uniforms is not None else None
            for r, result in zip(idx, self._generate_batch([rows[r] for r in idx], params, u)):
                results[r] = result
        return results

    def _generate_batch(
        self, rows: list[list[int]], params: SamplingParams, uniforms: torch.Tensor | None
    ) -> list[Result]:
        """Decode one batch; per row its tokens, log-probs and finish reason."""
        device = next(self._model.parameters()).device
        n, steps, pad = len(rows), params.max_new_tokens, self.pad_token_id
        stop_ids = sorted(set(self.eos_token_ids) | set(params.stop_token_ids))
        stop_ids = torch.tensor(stop_ids, dtype=torch.long, device=device)
        if uniforms is not None:
            uniforms = uniforms.to(device)
        logits, cache, masks = self._prefill(rows, steps, device)  # (N, V)
        out = DecodeOutputs(n, steps, pad, device)
        watch = StopWatch(self.tokenizer, params.stop, n) if params.stop else None
        done = torch.zeros(n, dtype=torch.bool, device=device)  # (N_cur,) finished rows
        n_done = 0
        for t in range(steps):
            u = None if uniforms is None else uniforms[out.index(), t]
            if t < params.min_new_tokens:
                logits = suppress_tokens(logits, stop_ids)
            tok, lp = next_tokens(
                logits, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                uniforms=u,
            )  # fmt: skip
            stopped = torch.isin(tok, stop_ids)  # (N_cur,)
            if n_done:
                tok, lp = tok.masked_fill(done, pad), lp.masked_fill(done, 0.0)
                stopped &= ~done
            if watch is not None:  # a stop string completed by this token ends its row
                rows_now = out.index()
                rows_now = range(n) if isinstance(rows_now, slice) else rows_now.tolist()
                hits = watch.step(rows_now, tok.tolist(), (~done).tolist())
                if t + 1 >= params.min_new_tokens:  # as vLLM: not before min_new_tokens
                    stopped |= torch.tensor(hits, dtype=torch.bool, device=device)
            out.write(t, tok, lp, stopped)
            done |= stopped
            n_done = int(done.sum())
            if n_done == len(done) or t == steps - 1:
                break
            if n_done * 2 >= len(done) and len(done) >= _COMPACT_MIN_ROWS:
                keep = (~done).nonzero().squeeze(-1)  # drop finished rows from the batch
                tok, done, n_done = tok[keep], done[keep], 0
                out.select(keep)
                masks.select(keep)
                cache.batch_select_indices(keep)
            if self._fast is not None:
                logits = self._fast.step(tok, masks.lens + t, masks.step_keys(t), cache)
            else:
                mask, positions = masks.step(t)
                logits = self._forward(tok[:, None], mask, positions, cache)
        return out.results()

    def _prefill(
        self, rows: list[list[int]], steps: int, device: torch.device
    ) -> tuple[torch.Tensor, DynamicCache, DecodeMasks]:
        """Run the left-padded prompts through the model once; identical prompts (the n
        samples of one prompt) are computed once and their cache rows copied.

        Returns the last-position logits (N, V), the filled cache and the batch's masks.
        """
        first: dict[tuple[int, ...], int] = {}
        inverse = [first.setdefault(tuple(r), len(first)) for r in rows]
        unique = [list(k) for k in first]
        lens = torch.tensor([len(r) for r in unique], device=device)  # (N_unique,)
        width = int(lens.max())
        pad = self.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in unique], device=device)
        masks = DecodeMasks(lens, width, steps, self._mask_dtype)
        mask, positions = masks.prefill()
        dtype = self._fast.compute_dtype if self._fast is not None else None
        cache = new_cache(self._model, width + steps, dtype)
        logits = self._forward(input_ids, mask, positions, cache)  # (N_unique, V)
        if len(unique) < len(rows):
            index = torch.tensor(inverse, device=device)
            cache.batch_select_indices(index)
            logits = logits[index]
            masks.select(index)
        return logits, cache, masks

    def _forward(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        """One cached forward of input_ids (N, S); returns the last position's logits (N, V)."""
        kwargs = {self._cache_kwarg: cache, "use_cache": True}
        if self._keep_last:
            kwargs["logits_to_keep"] = 1
        out = self._model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        return out.logits[:, -1, :]


def _additive_mask_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype for prepared 4D masks, or None when the model must build its own: attention
    other than sdpa / eager (e.g. flash, flex) or any sliding-window layer."""
    config = model.config
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        full = all(kind == "full_attention" for kind in layer_types)
    else:
        full = getattr(config, "sliding_window", None) is None
    return model.get_input_embeddings().weight.dtype if full else None


def _uniform_table(n_rows: int, params: SamplingParams) -> torch.Tensor | None:
    """(rows, T) float64 uniforms in [0, 1): row r's draw at step t is entry
    (row_ids[r], t) of the call's table."""
    if params.temperature == 0:
        return None
    rows = params.rows(n_rows)
    generator = None
    if params.seed is not None:
        generator = torch.Generator().manual_seed(params.seed)
    first = min(rows, default=0)
    shape = (max(rows, default=-1) + 1, params.max_new_tokens)
    table = torch.rand(shape, generator=generator, dtype=torch.float64)
    if rows == list(range(first, first + n_rows)):
        return table[first:]  # a contiguous slice: no copy
    return table[torch.tensor(rows, dtype=torch.long)]


@contextmanager
def _eval_mode(model: torch.nn.Module):
    """Put ``model`` in eval mode; restore every submodule's own train/eval flag after."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in flags:
            m.training = training


def own_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of ``module`` in eval mode, for an engine that owns its weights (one
    generating in a background thread while the original trains)."""
    return copy.deepcopy(module).requires_grad_(False).eval()


@register_engine("in_process")
def in_process_engine(
    spec: EngineSpec, *, module: torch.nn.Module | None = None, version: int = 0
) -> InProcessEngine:
    """The in-process engine generating with ``module`` (shared, not copied), or with the
    model loaded from ``spec.model_dir`` when no module is given."""
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
        version=version,
        precision=spec.precision,
        tokenizer=spec.tokenizer,
    )
