"""The critic: a policy's backbone plus a zero-initialised scalar value head.

    values[n, t] = w . h[n, t] + b,   h = backbone(input_ids)[n, t] (final hidden state)

``values[:, t]`` is V(s_t), the value of the state after reading tokens ``0..t``; the
advantage pipeline aligns it to next-token positions. ``w`` and ``b`` start at zero, so a
fresh critic predicts exactly 0 everywhere; :meth:`ValueModel.from_policy` warm-starts the
backbone with a deep copy of the policy's (the policy is neither shared nor modified).

On disk (``save_pretrained``) a critic is a Hugging Face token-classification checkpoint
with one label: ``config.json`` (``num_labels = 1``, ``classifier_dropout = 0``,
``architectures = ["<Family>ForTokenClassification"]``) and ``model.safetensors`` with the
backbone under ``model.*`` and the head as ``score.weight (1, H)`` / ``score.bias (1,)``.
For families whose token-classification class is ``model`` + ``score`` (Qwen2, Llama,
Mistral, Qwen3, ...), ``AutoModelForTokenClassification.from_pretrained(dir)`` loads it
as-is and its ``logits[..., 0]`` are these values for the same position ids; for other
families ``architectures`` is left unset and only :meth:`ValueModel.from_pretrained` reads
it. Weights are one safetensors file (no sharding yet).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_layers import GenericForTokenClassification
from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING

from ardea.model.backbone import check_input_ids, get_backbone, last_hidden_states
from ardea.model.loading import ModelLoadError, check_model_dir, first_line, resolve_dtype

WEIGHTS_NAME = "model.safetensors"
BACKBONE_PREFIX = "model."
HEAD_PREFIX = "score."


def _token_classification_arch(config: PretrainedConfig) -> str | None:
    """Name of the HF token-classification class whose layout (``model`` + ``score``)
    matches a saved critic, or ``None`` when this family has no such class."""
    try:
        cls = MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING[type(config)]
    except KeyError:
        return None
    return cls.__name__ if issubclass(cls, GenericForTokenClassification) else None


class ValueModel(nn.Module):
    """Critic ``values (N, S) = value_head(backbone(input_ids))``, float32.

    Attributes:
        config: the backbone's HF config (a copy of the policy's).
        model: the HF base model (e.g. ``Qwen2Model``).
        value_head: ``nn.Linear(H, 1)``, zero-initialised.
    """

    def __init__(self, config: PretrainedConfig, *, backbone: nn.Module | None = None):
        """Build a critic from ``config``; a fresh ``AutoModel.from_config(config)``
        backbone (random weights) unless ``backbone`` is given. The head is zero."""
        super().__init__()
        self.config = config
        self.model = backbone if backbone is not None else AutoModel.from_config(config)
        hidden_size = config.get_text_config().hidden_size
        self.value_head = nn.Linear(hidden_size, 1, dtype=torch.float32)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        device = next(self.model.parameters()).device
        self.value_head.to(device)

    @classmethod
    def from_policy(cls, policy: PreTrainedModel) -> ValueModel:
        """Critic whose backbone is a deep copy of ``policy``'s (same weights, dtype,
        device, train/eval mode and ``requires_grad`` flags); head zero."""
        backbone = copy.deepcopy(get_backbone(policy))
        return cls(copy.deepcopy(policy.config), backbone=backbone)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """Values of every prefix.

        Args:
            input_ids: ``(N, S)`` token ids (a 1-D packed batch is rejected).
            attention_mask: ``(N, S)``, 1 = real token; positions are derived from it when
                ``position_ids`` is ``None`` (``cumsum(mask) - 1``, left padding is safe).
            position_ids: ``(N, S)`` explicit positions.

        Returns:
            ``(N, S)`` float32 values ``w . h[n, t] + b`` (head applied in float32).
        """
        check_input_ids(input_ids, "critic")
        hidden = last_hidden_states(self.model, input_ids, attention_mask, position_ids)
        head = self.value_head
        values = F.linear(hidden.float(), head.weight.float(), head.bias.float())  # (N, S, 1)
        return values.squeeze(-1)

    def save_pretrained(
        self, save_directory: str | Path, *, state_dict: dict[str, Tensor] | None = None
    ) -> None:
        """Write ``config.json`` + ``model.safetensors`` (see module docstring); the weights
        are ``state_dict`` (this critic's names, e.g. gathered from shards) or its own."""
        root = Path(save_directory)
        root.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(self.config)
        config.num_labels = 1
        config.classifier_dropout = 0.0
        config.dtype = next(self.model.parameters()).dtype
        arch = _token_classification_arch(config)
        config.architectures = [arch] if arch is not None else None
        config.save_pretrained(root)
        own = self.state_dict() if state_dict is None else state_dict
        state = {}
        for key, value in own.items():
            prefix, name = key.split(".", 1)  # "model.<backbone key>" / "value_head.<head key>"
            stored = BACKBONE_PREFIX if prefix == "model" else HEAD_PREFIX
            state[stored + name] = value.detach().contiguous()
        save_file(state, str(root / WEIGHTS_NAME), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device = "cpu",
    ) -> ValueModel:
        """Load a critic written by :meth:`save_pretrained`; bit-exact when ``dtype`` is
        ``None`` (keep the stored dtype). The head stays float32. Raises
        :class:`~ardea.model.loading.ModelLoadError` for a missing/incomplete directory."""
        root = check_model_dir(path, what="critic")
        if not (root / WEIGHTS_NAME).is_file():
            raise ModelLoadError(f"critic directory {root} has no {WEIGHTS_NAME}")
        try:
            config = AutoConfig.from_pretrained(
                root, local_files_only=True, trust_remote_code=False
            )
        except Exception as error:  # library errors are multi-line; keep the first line
            raise ModelLoadError(
                f"cannot read the critic config in {root}: {first_line(error)}"
            ) from error
        state = load_file(str(root / WEIGHTS_NAME))
        backbone_state = _strip(state, BACKBONE_PREFIX)
        head_state = {k: v.float() for k, v in _strip(state, HEAD_PREFIX).items()}
        if not backbone_state:
            raise ModelLoadError(f"critic weights in {root} hold no backbone (model.*) tensors")
        stored = next(iter(backbone_state.values())).dtype
        torch_dtype = resolve_dtype(dtype) if dtype is not None else stored
        with torch.random.fork_rng(devices=[]):  # init is overwritten; keep caller's RNG
            backbone = AutoModel.from_config(config, dtype=torch_dtype)
        critic = cls(config, backbone=backbone)
        stray = [k for k in state if not k.startswith((BACKBONE_PREFIX, HEAD_PREFIX))]
        bad = stray + _load_exactly(critic.model, backbone_state, BACKBONE_PREFIX, root)
        bad += _load_exactly(critic.value_head, head_state, HEAD_PREFIX, root)
        if bad:
            shown = ", ".join(sorted(bad)[:3]) + (", ..." if len(bad) > 3 else "")
            raise ModelLoadError(
                f"critic weights in {root} do not match its config.json: {len(bad)} missing "
                f"or unexpected tensors ({shown})"
            )
        return critic.to(device).eval()


def _load_exactly(
    module: nn.Module, state: dict[str, Tensor], prefix: str, root: Path
) -> list[str]:
    """Copy ``state`` into ``module``; return the missing and unexpected key names (with
    ``prefix``). A shape mismatch is a :class:`ModelLoadError`."""
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as error:  # size mismatches; the first line is only a header
        detail = " ".join(str(error).split())
        raise ModelLoadError(
            f"critic weights in {root} do not match its config.json: {detail[:300]}"
        ) from error
    return [prefix + key for key in (*result.missing_keys, *result.unexpected_keys)]


def _strip(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """Entries of ``state`` under ``prefix``, with the prefix removed."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
