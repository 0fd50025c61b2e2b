"""A sequence scorer (a reward model): a causal LM's backbone under a one-label head.

    score[n] = w . h[n, last(n)]   (+ b for families whose head has a bias)

with ``h`` the backbone's final hidden states and ``last(n)`` the last position of row ``n``
that holds a non-pad token. The model is the family's own Hugging Face
``AutoModelForSequenceClassification`` class with ``num_labels = 1`` (``Qwen2ForSequence
Classification`` for the tiny model and Qwen2, ``LlamaForSequenceClassification``, ...), so
its forward is transformers' and ``save_pretrained`` writes a checkpoint that plain
transformers, vLLM's reward pooling and ardea's ``reward_model`` reward function load.

:func:`scorer_from_causal_lm` starts one from a causal LM: the backbone is taken over (not
copied), the language-model head dropped, and the score head starts at zero, so a fresh
scorer gives every text 0 (the first Bradley–Terry step then moves the head only; the
backbone receives gradient from the second step on).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

from ardea.errors import ConfigError
from ardea.model.backbone import get_backbone
from ardea.model.loading import check_model_dir, load_model_and_tokenizer


def scorer_from_causal_lm(model: PreTrainedModel, *, pad_token_id: int) -> PreTrainedModel:
    """The one-label sequence classifier of ``model``'s family on ``model``'s backbone (its
    weights, dtype and device), with a zero score head and ``pad_token_id`` set (the head
    reads each row's last non-pad token).

    Raises:
        ConfigError: the family has no sequence-classification class in transformers.
    """
    config = copy.deepcopy(model.config)
    try:
        cls = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)]
    except KeyError:
        raise ConfigError(
            f"model type {config.model_type!r} has no sequence-classification class in "
            "transformers, so it cannot be trained as a reward model"
        ) from None
    config.num_labels = 1
    config.pad_token_id = pad_token_id
    config.architectures = [cls.__name__]
    backbone = get_backbone(model)
    parameter = next(backbone.parameters())
    with torch.device("meta"):  # every tensor is replaced below: build nothing twice
        scorer = cls(config)
    setattr(scorer, scorer.base_model_prefix, backbone)
    for name, module in scorer.named_children():
        if name != scorer.base_model_prefix:
            setattr(scorer, name, _zero_like(module, parameter))
    left = [n for n, t in [*scorer.named_parameters(), *scorer.named_buffers()] if t.is_meta]
    if left:
        raise ConfigError(
            f"{cls.__name__} has tensors besides its backbone and head ({left[0]}); ardea "
            "cannot start it from a causal LM"
        )
    return scorer.train(model.training)


def _zero_like(module: nn.Module, like: torch.Tensor) -> nn.Module:
    """``module`` (built on the meta device) with real zero tensors in ``like``'s dtype and
    device."""
    module = module.to_empty(device=like.device).to(like.dtype)
    with torch.no_grad():
        for tensor in module.parameters():
            tensor.zero_()
    return module


def saved_as_scorer(path: str | Path) -> bool:
    """Whether the checkpoint in ``path`` is a sequence classifier (its config's
    ``architectures``), i.e. a reward model to go on training."""
    config = AutoConfig.from_pretrained(Path(path), local_files_only=True)
    return any(a.endswith("ForSequenceClassification") for a in config.architectures or ())


def load_scorer_and_tokenizer(
    path: str | Path, *, dtype: str | torch.dtype = "float32", device: str = "cpu"
) -> tuple[PreTrainedModel, Any]:
    """A scorer from ``path``: a saved sequence classifier as it is, else the causal LM in
    ``path`` under a zero head (:func:`scorer_from_causal_lm`)."""
    root = check_model_dir(path)
    if saved_as_scorer(root):
        model, tokenizer = load_model_and_tokenizer(
            root, dtype=dtype, device=device, auto_class=AutoModelForSequenceClassification
        )
        if model.config.num_labels != 1:
            raise ConfigError(
                f"model.path={str(path)!r} is a classifier with num_labels="
                f"{model.config.num_labels}; a reward model has one label"
            )
        return model, tokenizer
    model, tokenizer = load_model_and_tokenizer(root, dtype=dtype, device=device)
    return scorer_from_causal_lm(model, pad_token_id=tokenizer.pad_token_id), tokenizer
