"""Run set-up: device, seeds, the checkpoint to resume, and the policy named by the config."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from ardea.config import ArdeaConfig, ModelConfig
from ardea.errors import ArdeaError, ConfigError
from ardea.model import (
    Precision,
    build_char_tokenizer,
    build_tiny_model,
    load_model_and_tokenizer,
    load_scorer_and_tokenizer,
    scorer_from_causal_lm,
)
from ardea.model.autocast_experts import follow_autocast
from ardea.model.dtype_probe import ProbeShapes
from ardea.model.lora import apply_lora
from ardea.model.moe import moe_routing
from ardea.model.routing_replay import moe_blocks
from ardea.trainer.checkpoint import checkpoint_problem, latest_checkpoint, list_checkpoints
from ardea.trainer.strategies import OnlineStrategy, strategy_class


def resolve_device(name: str, field: str = "trainer.device") -> torch.device:
    """``auto`` → ``cuda`` when available, else ``cpu``; a name that is no device, or a
    missing GPU, is a ValueError naming ``field``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"{field}={name!r}: not a device (auto, cpu, cuda, cuda:N)") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{field}={name!r} but no CUDA device is available; use cpu or auto")
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def build_policy(
    model_config: ModelConfig, *, seed: int, device: torch.device, head: str = "causal_lm"
) -> tuple[Any, Any]:
    """The model and its tokenizer: loaded from ``model.path`` or the tiny default built in
    code; ``head="scorer"`` gives a one-label sequence scorer on that model's backbone
    (:mod:`ardea.model.scorer`; a saved scorer in ``model.path`` is loaded as it is)."""
    if model_config.path:
        load = load_scorer_and_tokenizer if head == "scorer" else load_model_and_tokenizer
        return load(model_config.path, dtype=model_config.dtype, device=str(device))
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer,
        hidden_size=model_config.hidden_size,
        num_layers=model_config.num_layers,
        num_heads=model_config.num_heads,
        num_kv_heads=model_config.num_kv_heads,
        intermediate_size=model_config.intermediate_size,
        max_position_embeddings=model_config.max_position_embeddings,
        seed=seed,
        arch=model_config.arch,
        num_experts=model_config.num_experts,
        experts_per_token=model_config.experts_per_token,
    )
    dtype = getattr(torch, model_config.dtype)
    model = model.to(device=device, dtype=dtype)
    if head == "scorer":
        model = scorer_from_causal_lm(model, pad_token_id=tokenizer.pad_token_id)
    return model, tokenizer


def build_trainable_policy(
    config: ArdeaConfig, device: torch.device, *, lora: bool = True
) -> tuple[Any, Any]:
    """The model as trained: :func:`build_policy` with the head the strategy trains
    (``model_head``), wrapped with LoRA adapters when ``model.lora_r > 0`` (``lora=False``
    gives the plain initial model, e.g. a reference)."""
    head = strategy_class(config.algo.name).model_head
    model, tokenizer = build_policy(
        config.model, seed=config.trainer.seed, device=device, head=head
    )
    follow_autocast(model)  # before anything evaluates or generates with it
    check_routing_replay(config, model)
    m = config.model
    if lora and m.lora_r:
        model = apply_lora(
            model,
            r=m.lora_r,
            alpha=m.lora_alpha,
            dropout=m.lora_dropout,
            target_modules=list(m.lora_target_modules),
            task_type="SEQ_CLS" if head == "scorer" else "CAUSAL_LM",
        ).to(device)
    return model, tokenizer


def check_routing_replay(config: ArdeaConfig, policy: torch.nn.Module) -> None:
    """``algo.moe_routing_replay`` on a run it can act on: online RL with an MoE policy."""
    if not config.algo.moe_routing_replay:
        return
    option = "algo.moe_routing_replay=true"
    if not issubclass(strategy_class(config.algo.name), OnlineStrategy):
        raise ConfigError(
            f"{option} replays the routing of rollouts; algo.name={config.algo.name} trains "
            "on data (set algo.moe_routing_replay=false)"
        )
    if moe_routing(policy) is None or not moe_blocks(policy):
        raise ConfigError(
            f"{option} needs a mixture-of-experts policy; {type(policy).__name__} routes no "
            "tokens to experts (set algo.moe_routing_replay=false)"
        )


def check_distributed(config: ArdeaConfig, dist: Any) -> None:
    """Batch sizes that do not split into equal rank shares, as :class:`ConfigError`s
    naming the fields (everything one process runs, several run)."""
    if not dist.active:
        return
    trainer, algo = config.trainer, config.algo
    online = issubclass(strategy_class(algo.name), OnlineStrategy)
    parts = algo.ppo_mini_batches * trainer.grad_accum_steps if online else trainer.grad_accum_steps
    share, uneven = divmod(trainer.batch_size, dist.world_size)
    if uneven or share < parts or (not online and share % parts):
        raise ConfigError(
            f"trainer.batch_size={trainer.batch_size} does not split over {dist.world_size} "
            f"processes: each rank takes batch_size / {dist.world_size} "
            + (
                "prompts and needs at least algo.ppo_mini_batches × trainer.grad_accum_steps"
                if online
                else "samples, a multiple of trainer.grad_accum_steps"
            )
            + f" = {parts} of them"
        )


def resume_checkpoint(run_dir: Path, resume: str) -> Path | None:
    """The checkpoint to continue from, per ``trainer.resume`` (never / auto / a path)."""
    if resume == "never":
        if list_checkpoints(run_dir):
            raise ArdeaError(
                f"run directory {run_dir} already holds checkpoints; continue it with "
                "trainer.resume=auto or choose another trainer.output_dir"
            )
        return None
    if resume == "auto":
        return latest_checkpoint(run_dir)
    path = Path(resume)
    problem = checkpoint_problem(path) if path.is_dir() else "no such directory"
    if problem is not None:
        raise ArdeaError(f"trainer.resume={resume!r} cannot be loaded: {problem}")
    return path


def context_length(model: Any) -> int:
    return int(getattr(model.config, "max_position_embeddings", 2048))


def probe_shapes(
    config: ArdeaConfig, model: Any, max_length: int, world_size: int = 1
) -> ProbeShapes:
    """The matmul shapes ``compute_dtype=auto`` times (:mod:`ardea.model.dtype_probe`): a
    micro-batch of this run's longest sequences through the MLP's up-projection, and one
    decode step of a generation batch. Upper bounds: the probe cuts rows to a fixed budget."""
    algo, trainer, rollout = config.algo, config.trainer, config.rollout
    hidden = int(model.config.hidden_size)
    intermediate = int(getattr(model.config, "intermediate_size", None) or 4 * hidden)
    online = issubclass(strategy_class(algo.name), OnlineStrategy)
    prompts = max(1, trainer.batch_size // world_size)
    if online:
        sequences = (
            prompts * rollout.group_size // (algo.ppo_mini_batches * trainer.grad_accum_steps)
        )
        decode_rows = min(rollout.batch_size, prompts) * rollout.group_size
    else:
        sequences = prompts // trainer.grad_accum_steps
        decode_rows = rollout.batch_size
    return ProbeShapes(hidden, intermediate, max(1, sequences) * max_length, max(1, decode_rows))


def resolve_precision(
    config: ArdeaConfig, policy: Any, shapes: ProbeShapes, dist: Any
) -> Precision:
    """The run's :class:`~ardea.model.Precision` (``compute_dtype=auto`` measured at this
    run's ``shapes``, rank 0's measurement on every rank, its line printed once)."""
    precision = Precision.resolve(
        config.model.compute_dtype,
        dist.device,
        next(policy.parameters()).dtype,
        config.model.attn_implementation,
        shapes=shapes,
        agree=dist.broadcast,
    )
    if precision.probe is not None and dist.is_main:
        print(f"[ardea] {precision.probe.describe()}", flush=True)
    return precision
