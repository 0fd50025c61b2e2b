"""Models: HF causal LM + tokenizer loading, the tiny default model, the critic, log-probs.

Imports torch, transformers, tokenizers, safetensors and lower ardea layers only.
"""

from ardea.model.backbone import (
    PLAIN_HEAD_MODEL_TYPES,
    get_backbone,
    last_hidden_states,
    position_ids_from_mask,
    split_causal_lm,
)
from ardea.model.loading import (
    ModelLoadError,
    check_model_dir,
    load_model_and_tokenizer,
    load_tokenizer,
    resolve_dtype,
)
from ardea.model.logprobs import (
    LogprobOutput,
    entropy_from_logits,
    logprobs_from_logits,
    scale_logits,
    sequence_logprobs,
)
from ardea.model.precision import COMPUTE_DTYPES, Precision
from ardea.model.scorer import load_scorer_and_tokenizer, scorer_from_causal_lm
from ardea.model.tiny import TINY_ARCHS, build_tiny_model, tiny_config
from ardea.model.tokenizer import (
    BOS_TOKEN,
    CHAT_TEMPLATE,
    EOS_TOKEN,
    IM_END_TOKEN,
    IM_START_TOKEN,
    PAD_TOKEN,
    UNK_TOKEN,
    build_char_tokenizer,
)
from ardea.model.value import ValueModel

__all__ = [
    "BOS_TOKEN",
    "COMPUTE_DTYPES",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "IM_END_TOKEN",
    "IM_START_TOKEN",
    "PAD_TOKEN",
    "PLAIN_HEAD_MODEL_TYPES",
    "Precision",
    "TINY_ARCHS",
    "UNK_TOKEN",
    "LogprobOutput",
    "ModelLoadError",
    "ValueModel",
    "build_char_tokenizer",
    "load_scorer_and_tokenizer",
    "scorer_from_causal_lm",
    "build_tiny_model",
    "check_model_dir",
    "entropy_from_logits",
    "get_backbone",
    "last_hidden_states",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "logprobs_from_logits",
    "scale_logits",
    "position_ids_from_mask",
    "resolve_dtype",
    "sequence_logprobs",
    "split_causal_lm",
    "tiny_config",
]
