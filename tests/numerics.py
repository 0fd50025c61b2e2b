"""Float32 tolerances derived from the arithmetic, not fitted to one machine.

Two computations of the same gradient that differ only in how they group the work (micro-
batches, padding, processes, the CPU's vector width) sum the same per-token terms in another
order. A sum of ``n`` float32 terms computed in any order is within
``gamma(n) = n * u / (1 - n * u)`` (``u = 2**-24``, float32's unit roundoff) of the exact
sum, relative to the sum of the terms' magnitudes (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., section 4.2). The comparisons here measure each tensor's
largest difference against that tensor's largest gradient, so a tensor of small gradients
is held to its own scale, not to its neighbours'.

What these tolerances must not absorb: a wrong reduction or normalisation (a sum where a
mean is meant, a micro-batch dropped, a missing scale) changes a gradient by a relative
amount of order one, many orders above ``gamma(n)`` for any batch a test uses.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

#: float32 unit roundoff
UNIT_ROUNDOFF = 2.0**-24


def gamma(terms: int) -> float:
    """Higham's ``gamma_n``: the relative error bound of an ``n``-term float32 sum."""
    if not 0 < terms * UNIT_ROUNDOFF < 1:
        raise ValueError(f"gamma needs 0 < n * u < 1, got n = {terms}")
    return terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF)


def decoder_gradient_terms(config, *, rows: int, span: int) -> int:
    """How many float32 terms are summed along the longest path into one gradient entry of
    a decoder (a Hugging Face ``config``: ``vocab_size``, ``hidden_size``,
    ``intermediate_size``, ``num_hidden_layers``) trained on ``rows`` sequences of at most
    ``span`` tokens, an upper estimate: the batch's positions (a weight's gradient sums one
    product per token), the softmax over the vocabulary, and per layer the hidden and MLP
    widths of the matmuls and the attention span. To first order the relative errors of
    sums in a chain add up, so ``gamma`` of the total bounds them; it is an estimate, not a
    proof, where a backward pass cancels large terms."""
    per_layer = config.hidden_size + config.intermediate_size + span
    return rows * span + config.vocab_size + config.num_hidden_layers * per_layer


def gradient_differences(
    expected: Mapping[str, torch.Tensor | None], got: Mapping[str, torch.Tensor | None]
) -> dict[str, float]:
    """Per tensor, ``max |got - expected| / max |expected|`` (the scale floored at ``u``
    times the largest gradient of all the tensors, for a tensor whose exact gradient is
    zero). A tensor that is None (no gradient) in one must be None in the other."""
    assert expected.keys() == got.keys(), (sorted(expected), sorted(got))
    present = [g for g in expected.values() if g is not None]
    overall = max((float(g.abs().max()) for g in present if g.numel()), default=0.0)
    out = {}
    for name, g in expected.items():
        assert (g is None) == (got[name] is None), name
        if g is None or not g.numel():
            continue
        scale = max(float(g.abs().max()), overall * UNIT_ROUNDOFF, torch.finfo(g.dtype).tiny)
        out[name] = float((got[name].double() - g.double()).abs().max()) / scale
    return out


def assert_gradients_close(
    expected: Mapping[str, torch.Tensor | None],
    got: Mapping[str, torch.Tensor | None],
    *,
    terms: int,
) -> None:
    """``got`` equals ``expected`` tensor by tensor within ``gamma(terms)`` of each tensor's
    largest gradient: the same gradient summed in another order, where ``terms`` bounds how
    many float32 terms are summed into one entry (e.g. the tokens of the batch)."""
    differences = gradient_differences(expected, got)
    worst = max(differences, key=differences.get)
    assert differences[worst] <= gamma(terms), (worst, differences[worst], gamma(terms))
