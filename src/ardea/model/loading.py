"""Load a Hugging Face causal LM and its tokenizer from a local directory.

No hub access is assumed: everything is read with ``local_files_only=True`` and
``trust_remote_code=False``. Weights are read from safetensors only; a directory that holds
only pickled PyTorch weights (``pytorch_model.bin``) is refused, because unpickling runs
arbitrary code. Convert such a checkpoint once with
``AutoModelForCausalLM.from_pretrained(dir).save_pretrained(new_dir)`` in an environment you
trust. Every failure is a :class:`ModelLoadError` with one line naming the path and what is
missing or wrong.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ardea.errors import ArdeaError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class ModelLoadError(ArdeaError):
    """A local model directory is missing, incomplete or unreadable (one-line message)."""


def first_line(error: BaseException) -> str:
    """First non-empty line of an exception's message, for wrapping library errors."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` (or a ``torch.dtype``) -> ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def check_model_dir(path: str | Path, *, what: str = "model") -> Path:
    """Check that ``path`` holds ``config.json`` and safetensors weights.

    Returns the path; raises :class:`ModelLoadError` naming the path and the missing piece.
    """
    root = Path(path)
    if not root.exists():
        raise ModelLoadError(f"{what} directory {root} does not exist")
    if not root.is_dir():
        raise ModelLoadError(f"{what} path {root} is not a directory")
    if not (root / "config.json").is_file():
        raise ModelLoadError(f"{what} directory {root} has no config.json")
    if not any(root.glob("*.safetensors")):
        if any(root.glob("*.bin")) or any(root.glob("*.pt")):
            raise ModelLoadError(
                f"{what} directory {root} holds only pickled PyTorch weights (*.bin/*.pt); "
                "ardea reads safetensors only: re-save it with save_pretrained "
                "(safe_serialization) where you trust the files"
            )
        raise ModelLoadError(f"{what} directory {root} has no weights (*.safetensors)")
    return root


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer in ``path``; give it ``pad_token = eos_token`` if it has none."""
    root = Path(path)
    if not any((root / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelLoadError(
            f"model directory {root} has no tokenizer ({' or '.join(_TOKENIZER_FILES)})"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            root, local_files_only=True, trust_remote_code=False
        )
    except Exception as error:  # library errors are multi-line; re-raise as one line
        raise ModelLoadError(f"cannot load the tokenizer in {root}: {first_line(error)}") from error
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(f"the tokenizer in {root} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _check_loading_info(root: Path, info: dict) -> None:
    """Refuse a checkpoint whose weights do not cover the model (transformers would
    silently initialise the missing ones at random)."""
    bad = sorted(info.get("missing_keys") or ()) + sorted(
        str(key) for key in info.get("mismatched_keys") or ()
    )
    if bad:
        shown = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "")
        raise ModelLoadError(
            f"model weights in {root} do not match config.json: {len(bad)} missing or "
            f"mis-shaped tensors ({shown})"
        )


def load_model_and_tokenizer(
    path: str | Path,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    auto_class: type = AutoModelForCausalLM,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``AutoModelForCausalLM`` (or ``auto_class``) + ``AutoTokenizer`` from a local
    directory.

    Args:
        path: a directory written by ``save_pretrained`` (config.json, *.safetensors and
            tokenizer files).
        dtype: parameter dtype, ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        device: where to put the model.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode. Weights missing from the
        checkpoint are an error (transformers would initialise them at random); extra
        tensors in it are ignored. When the tokenizer has no pad
        token it gets ``pad_token = eos_token``, and a model config/generation config
        without ``pad_token_id`` gets the tokenizer's.
    """
    root = check_model_dir(path)
    torch_dtype = resolve_dtype(dtype)
    tokenizer = load_tokenizer(root)
    try:
        model, info = auto_class.from_pretrained(
            root,
            dtype=torch_dtype,
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=True,
            output_loading_info=True,
        )
    except Exception as error:  # library errors are multi-line; re-raise as one line
        raise ModelLoadError(f"cannot load the model in {root}: {first_line(error)}") from error
    _check_loading_info(root, info)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    generation = getattr(model, "generation_config", None)  # classifiers have none
    if generation is not None and generation.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer
