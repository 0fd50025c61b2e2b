"""The precision matmuls run in: parameters keep ``model.dtype``; forwards (training, log-probs,
generation) run under ``torch.autocast`` in the compute dtype (``model.compute_dtype``).

``auto`` measures: with float32 parameters on a device that has bfloat16 kernels (any CPU;
CUDA GPUs that support it), :mod:`ardea.model.dtype_probe` times the run's own matmul shapes
in float32 and under bfloat16 autocast and picks the faster. CPU flags cannot decide it: bf16
ran 2-3x faster than fp32 on an AVX-512-BF16 CPU without AMX, 1.9-5.5x slower on another
with the same flags, hundreds of times slower where it is emulated (AVX2), and several times
faster with AMX tiles (``benchmarks/README.md``). Other parameter dtypes compute in their
own dtype. The choice and the measured rates are printed at the start of a run and stored in
``results.json``; under ``torchrun`` rank 0's choice is every rank's.

Under autocast the logits come out of the LM head in the compute dtype; log-probs, entropies
and sampling probabilities are then computed in float32 (:mod:`ardea.model.logprobs`). The
behaviour log-probs of the engine and the trainer's recomputed ones agree less closely than in
float32 (their matmuls are shaped differently), which the online-RL tests bound.

The attention kernel of a training or log-prob forward (``model.attn_implementation``):
``auto`` runs the ``eager`` kernel (two matmuls and a softmax) for sequences of at most
:data:`EAGER_MAX_TOKENS` tokens when computing in a 16-bit dtype on CPU, where PyTorch's
``sdpa`` CPU kernels are slower, forward and backward (``benchmarks/bench_train_pass.py``,
in ``benchmarks/README.md``: eager 24 % faster at 64 tokens, 15 % at 128, 14 % slower at 256,
54 % at 512), and the model's own kernel otherwise. The two kernels compute the same attention up to rounding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ardea.config.schema import ATTENTIONS, COMPUTE_DTYPES
from ardea.errors import ConfigError
from ardea.model.autocast_experts import follow_autocast
from ardea.model.dtype_probe import ProbeResult, ProbeShapes, probe

EAGER_MAX_TOKENS = 128
"""Longest sequence that ``attn_implementation=auto`` runs with the eager kernel on CPU."""


def has_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` has bfloat16 matmul kernels worth timing (fast or not: the probe
    decides)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return device.type == "cpu"


@dataclass(frozen=True)
class Precision:
    """Where and in which dtypes a model computes: ``params`` its parameters' dtype,
    ``compute`` the dtype its matmuls run in, ``probe`` the measurement behind ``auto``'s
    choice (module docstring)."""

    device: torch.device
    params: torch.dtype
    compute: torch.dtype
    attention: str = "auto"
    probe: ProbeResult | None = None

    @classmethod
    def resolve(
        cls,
        name: str,
        device: torch.device,
        params: torch.dtype,
        attention: str = "auto",
        *,
        shapes: ProbeShapes | None = None,
        agree: Callable[[ProbeResult], ProbeResult] | None = None,
    ) -> Precision:
        """``model.compute_dtype=name`` on ``device``: ``auto`` is the faster of the
        parameters' dtype and bfloat16 at ``shapes`` (measured, module docstring; ``agree``
        makes every rank take rank 0's measurement), never above the parameters' precision.

        Raises:
            ConfigError: an unknown name, or a compute dtype more precise than the parameters.
            ValueError: ``auto`` with float32 parameters and no ``shapes`` to measure.
        """
        if name not in COMPUTE_DTYPES:
            known = ", ".join(COMPUTE_DTYPES)
            raise ConfigError(f"model.compute_dtype={name!r}; choose one of {known}")
        if attention not in ATTENTIONS:
            known = ", ".join(ATTENTIONS)
            raise ConfigError(f"model.attn_implementation={attention!r}; choose one of {known}")
        if name == "auto":
            if params != torch.float32 or not has_bfloat16(device):
                return cls(device, params, params, attention)
            if shapes is None:
                raise ValueError("compute_dtype=auto needs the run's matmul shapes to measure")
            measured = probe(device, params, [params, torch.bfloat16], shapes)
            if agree is not None:
                measured = agree(measured)
            return cls(device, params, getattr(torch, measured.choice), attention, measured)
        dtype = getattr(torch, name)
        if torch.finfo(dtype).bits > torch.finfo(params).bits:
            raise ConfigError(
                f"model.compute_dtype={name} is more precise than the parameters "
                f"(model.dtype={str(params).removeprefix('torch.')}); set model.dtype=float32"
            )
        return cls(device, params, dtype, attention)

    def autocast(self):
        """``torch.autocast`` to the compute dtype, or a no-op when the parameters are
        already in it."""
        if self.compute == self.params:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute)

    def attention_for(self, seq_len: int) -> str | None:
        """The attention kernel for a forward over ``seq_len`` tokens, or None to keep the
        model's own (module docstring)."""
        if self.attention != "auto":
            return self.attention
        sixteen_bit = self.compute in (torch.bfloat16, torch.float16)
        if self.device.type == "cpu" and sixteen_bit and seq_len <= EAGER_MAX_TOKENS:
            return "eager"
        return None

    @contextlib.contextmanager
    def forward(self, model: torch.nn.Module, seq_len: int):
        """Run a training or log-prob forward of ``model`` over ``seq_len`` tokens: under
        :meth:`autocast`, with the kernel of :meth:`attention_for` (the model's own kernel is
        restored afterwards; models that cannot switch kernels keep theirs) and its experts in
        the compute dtype (:mod:`ardea.model.autocast_experts`)."""
        wanted = self.attention_for(seq_len)
        config = getattr(model, "config", None)
        current = getattr(config, "_attn_implementation", None)
        switch = (
            wanted is not None
            and current in ("sdpa", "eager")
            and current != wanted
            and hasattr(model, "set_attn_implementation")
        )
        if switch:
            model.set_attn_implementation(wanted)
        follow_autocast(model)
        try:
            with self.autocast():
                yield
        finally:
            if switch:
                model.set_attn_implementation(current)
