"""Pure next-token sampling: logits → filtered distribution → token and its log-prob.

Notation: ``N`` rows (sequences being generated), ``V`` vocabulary. All functions take the
last-position logits ``(N, V)`` and are free of model, cache and RNG state: randomness comes in
as one uniform number per row, so a row's sample depends only on its own logits and its own
uniform (which makes batched generation equal to generating each row alone).

The sampled distribution for temperature ``T > 0``, top-k ``k`` and top-p ``p`` is

    z = logits / T
    K = top-k set of z (all tokens tied with the k-th value kept), then the top-p set of
        softmax(z restricted to K): the most likely tokens, in order, up to and including
        the first one at which their cumulative mass reaches p
    π(v) = exp(z_v) / Σ_{u ∈ K} exp(z_u)   for v ∈ K, 0 otherwise,

and the reported log-prob of the sampled token is ``log π(v)``, computed by the same
functions as the trainer's log-probs (:func:`ardea.model.scale_logits`,
:func:`ardea.model.logprobs_from_logits`). With k = 0 and p = 1 this is
``log_softmax(logits / T)``. Greedy (``T = 0``) picks ``argmax logits`` and reports
``log_softmax(logits)[argmax]`` (the T = 1 distribution).

Suppressed tokens (stop tokens before ``min_new_tokens``, :func:`suppress_tokens`) have their
logits set to −inf *before* all of the above, as transformers' ``min_new_tokens`` does, so π
and the reported log-prob are those of the masked distribution actually sampled from. With
truncation off and ``p_S = Σ_{s ∈ S} softmax(logits / T)_s`` the mass of the suppressed set S,

    log π(v) = log_softmax(logits / T)_v − log(1 − p_S)        for v ∉ S,

so an unmasked recomputation of the same token is lower by ``−log(1 − p_S) ≥ 0``.
"""

from __future__ import annotations

import torch

from ardea.model.logprobs import logprobs_from_logits, scale_logits
from ardea.model.truncation import truncate


def sampling_logits(
    logits: torch.Tensor, *, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """The logits of the distribution π actually sampled from (module docstring).

    logits: (N, V) → (N, V) float32, equal to ``logits / T`` on the kept set and −inf
    elsewhere, so that ``log_softmax`` of the result is log π. Requires T > 0.
    """
    return truncate(scale_logits(logits, temperature), top_k, top_p)


def suppress_tokens(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """``logits`` with the columns ``token_ids`` set to −inf (a new tensor).

    logits: (N, V); token_ids: (K,) long, K < V. The row keeps its other V − K entries, so
    softmax of the result is renormalised over them.
    """
    return logits.index_fill(-1, token_ids, float("-inf"))


def sample_inverse_cdf(z: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Draw one token per row from softmax(z) by inverting its CDF at a given uniform.

    z: (N, V) logits (−inf allowed, at least one finite per row); uniforms: (N,) in [0, 1).
    Returns tokens (N,) long: the first v with CDF(v) > u · CDF(V−1). The CDF is summed in
    float64 and the threshold kept strictly below the total, so a token of zero probability
    is never returned.
    """
    probs = torch.softmax(z.float(), dim=-1)  # (N, V)
    cdf = torch.cumsum(probs.double(), dim=-1)  # (N, V)
    total = cdf[:, -1:]  # (N, 1)
    threshold = uniforms.to(device=cdf.device, dtype=torch.float64)[:, None] * total
    threshold = torch.minimum(threshold, torch.nextafter(total, torch.zeros_like(total)))
    tokens = torch.searchsorted(cdf, threshold, right=True)  # (N, 1)
    return tokens.squeeze(-1)


def next_tokens(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token of every row and its behaviour log-prob.

    logits: (N, V); uniforms: (N,) in [0, 1), required when ``temperature > 0``.
    Returns ``(tokens (N,) long, logprobs (N,) float32)``: greedy argmax with
    ``log_softmax(logits)`` when T = 0, else a draw from π with ``log π`` (module docstring).
    """
    if temperature == 0:
        tokens = torch.argmax(logits, dim=-1)
        return tokens, logprobs_from_logits(logits, tokens).float()
    if uniforms is None:
        raise ValueError("uniforms are required when temperature > 0")
    z = sampling_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    tokens = sample_inverse_cdf(z, uniforms)
    return tokens, logprobs_from_logits(z, tokens).float()
