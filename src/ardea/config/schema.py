"""The run configuration: one dataclass per section, each field with a help text.

A run is described by :class:`ArdeaConfig` with the sections ``model``, ``data``,
``algo``, ``rollout``, ``trainer`` and ``logging``. Every section validates itself in
``__post_init__`` so that a bad value fails before any work starts, with a message
naming the field and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ardea.config.agent import AgentConfig
from ardea.config.algo import AlgoConfig
from ardea.config.fields import check_choices, check_range, option
from ardea.config.reward import RewardConfig
from ardea.config.rollout import RolloutConfig
from ardea.config.trainer import TrainerConfig
from ardea.errors import ConfigError

DTYPES = ("float32", "bfloat16", "float16")
COMPUTE_DTYPES = ("auto", *DTYPES)
ATTENTIONS = ("auto", "sdpa", "eager")
ARCHS = ("qwen2", "llama", "qwen3_moe")
MOE_ARCHS = ("qwen3_moe",)


@dataclass
class ModelConfig:
    path: str | None = option(
        None, "Local Hugging Face model directory; null builds the tiny default model in code."
    )
    arch: str = option(
        "qwen2",
        "Architecture of the tiny default model: qwen2, llama, or qwen3_moe (a Qwen3-MoE: "
        "every layer's MLP is model.num_experts experts of model.intermediate_size, "
        "model.experts_per_token per token).",
        choices=ARCHS,
    )
    hidden_size: int = option(128, "Tiny model: hidden size.")
    num_layers: int = option(4, "Tiny model: number of decoder layers.")
    num_heads: int = option(4, "Tiny model: attention heads.")
    num_kv_heads: int = option(2, "Tiny model: key/value heads (grouped-query attention).")
    intermediate_size: int = option(384, "Tiny model: MLP inner size (each expert's, for MoE).")
    num_experts: int = option(8, "Tiny MoE model (model.arch=qwen3_moe): experts per layer.")
    experts_per_token: int = option(
        2, "Tiny MoE model (model.arch=qwen3_moe): experts each token is routed to."
    )
    max_position_embeddings: int = option(256, "Tiny model: longest sequence it accepts.")
    dtype: str = option("float32", "Parameter dtype: float32, bfloat16 or float16.", choices=DTYPES)
    compute_dtype: str = option(
        "auto",
        "The dtype matmuls run in (autocast) for training, log-probs and generation; "
        "parameters stay model.dtype. auto: with float32 parameters, the faster of float32 and "
        "bfloat16 at the run's matmul shapes, measured at start (cached in ~/.cache/ardea); "
        "else model.dtype. float32, bfloat16 or float16 to choose.",
        choices=COMPUTE_DTYPES,
    )
    attn_implementation: str = option(
        "auto",
        "Attention kernel of training and log-prob forwards: auto = eager for sequences of at "
        "most 128 tokens when computing in bfloat16/float16 on CPU (faster there than sdpa's "
        "kernels, measured in benchmarks/README.md), the model's own kernel otherwise; sdpa "
        "or eager to force one.",
        choices=ATTENTIONS,
    )
    logprob_chunk_size: int = option(
        1024, "Tokens per chunk when computing log-probs (bounds the float32 logits kept at once)."
    )
    lora_r: int = option(0, "LoRA rank (peft); 0 trains all weights.")
    lora_alpha: float = option(16.0, "LoRA scaling numerator (scale = alpha / r).")
    lora_dropout: float = option(0.0, "Dropout on the LoRA input.")
    lora_target_modules: list[str] = option(
        help="Module names LoRA adapts.",
        factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
    )

    def __post_init__(self) -> None:
        check_choices(self, "model")
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
            check_range(f"model.{name}", getattr(self, name), low=1)
        check_range("model.max_position_embeddings", self.max_position_embeddings, low=8)
        check_range("model.logprob_chunk_size", self.logprob_chunk_size, low=1)
        check_range("model.lora_r", self.lora_r, low=0)
        check_range("model.lora_dropout", self.lora_dropout, low=0.0, high=1.0, high_open=True)
        if self.lora_r and not self.lora_target_modules:
            raise ConfigError("model.lora_target_modules is empty; name the modules LoRA adapts")
        self._check_experts()
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"model.hidden_size={self.hidden_size} must be divisible by "
                f"model.num_heads={self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_heads={self.num_heads} must be divisible by "
                f"model.num_kv_heads={self.num_kv_heads}"
            )

    def _check_experts(self) -> None:
        if self.arch not in MOE_ARCHS or self.path:
            for name in ("num_experts", "experts_per_token"):
                if getattr(self, name) != getattr(ModelConfig, name):
                    raise ConfigError(
                        f"model.{name}={getattr(self, name)} is read only by the tiny MoE model "
                        f"(model.arch=qwen3_moe, no model.path); this run has "
                        f"model.arch={self.arch}"
                        + (f", model.path={self.path}" if self.path else "")
                    )
            return
        check_range("model.experts_per_token", self.experts_per_token, low=1)
        if self.num_experts < self.experts_per_token:
            raise ConfigError(
                f"model.num_experts={self.num_experts} must be at least "
                f"model.experts_per_token={self.experts_per_token}"
            )


@dataclass
class DataConfig:
    task: str | None = option(
        "arithmetic",
        "Built-in task by registered name (see `ardea tasks`): the training data when data.path "
        "is null, and the held-out accuracy evaluation; null for none.",
    )
    path: str | None = option(
        None,
        "Training data: a .jsonl/.json/.parquet file or a Hugging Face `datasets` directory; "
        "null generates it from data.task.",
    )
    eval_path: str | None = option(
        None,
        "Held-out data in the same format as data.path; its loss is logged as eval/loss, or "
        "for online strategies (prompt records) the reward of greedy completions as "
        "eval/reward_mean.",
    )
    max_length: int = option(0, "Longest training sequence in tokens (0 = the model's context).")
    packing: bool = option(
        False, "Pack several documents into each row (position ids restart per document)."
    )
    task_args: dict[str, Any] = option(
        help="Keyword arguments of the task, e.g. {digits: 3, ops: '+'}; unknown ones are errors.",
        factory=dict,
    )
    train_size: int = option(50_000, "Number of training examples generated for the task.")
    eval_size: int = option(500, "Number of held-out examples used for evaluation.")
    seed: int = option(0, "Seed of the task's train/held-out split (independent of trainer.seed).")
    chat_template: bool = option(
        False, "Wrap prompts in the tokenizer's chat template (for chat models)."
    )

    def __post_init__(self) -> None:
        check_range("data.train_size", self.train_size, low=1)
        check_range("data.eval_size", self.eval_size, low=1)
        check_range("data.max_length", self.max_length, low=0)


@dataclass
class LoggingConfig:
    tensorboard: bool = option(True, "Write TensorBoard events into the run directory.")
    log_every: int = option(10, "Write training metrics every N steps.")
    progress: bool = option(True, "Show a progress bar.")
    report: bool = option(
        True,
        "Draw report.png (and an online run's trajectories.html) when the run ends; "
        "false skips the drawing (about half a second: many short runs, a sweep); "
        "`ardea report RUN_DIR` draws them from the run's files at any time.",
    )
    wandb: bool = option(False, "Log to Weights & Biases as well.")
    wandb_project: str = option("ardea", "Weights & Biases project.")
    wandb_mode: str = option(
        "offline",
        "Weights & Biases mode: offline (no network) or online.",
        choices=("offline", "online"),
    )

    def __post_init__(self) -> None:
        check_choices(self, "logging")
        check_range("logging.log_every", self.log_every, low=1)


@dataclass
class ArdeaConfig:
    model: ModelConfig = option(
        help="The policy: a local Hugging Face model directory, or the tiny default model "
        "built in code (its shape below); its dtypes, attention kernel and LoRA.",
        factory=ModelConfig,
    )
    data: DataConfig = option(
        help="What the run trains and evaluates on: a built-in task or data files.",
        factory=DataConfig,
    )
    algo: AlgoConfig = option(
        help="The training strategy (algo.name) and its options.", factory=AlgoConfig
    )
    rollout: RolloutConfig = option(
        help="How online RL (and sampled evaluation) generates: the engine, sampling, "
        "group size, staleness and partial rollouts.",
        factory=RolloutConfig,
    )
    reward: RewardConfig = option(
        help="How online RL scores completions: the reward functions, their timeout and "
        "what a failing one does, the overlong penalty.",
        factory=RewardConfig,
    )
    trainer: TrainerConfig = option(
        help="The optimisation loop: steps, batch, optimizer and schedule, evaluation, "
        "checkpoints, device and processes.",
        factory=TrainerConfig,
    )
    logging: LoggingConfig = option(
        help="Where metrics go (metrics.jsonl always; TensorBoard, Weights & Biases), the "
        "progress bar and the report drawn at the end.",
        factory=LoggingConfig,
    )
    agent: AgentConfig = option(
        help="Multi-turn agent runs: an environment or an agent workflow played instead of "
        "single prompts.",
        factory=AgentConfig,
    )
    stages: dict[str, Any] = option(
        help="Run these stages one after the other, in order: name -> overrides of the "
        "sections above (e.g. {sft: {algo: {name: sft}}, rl: {algo: {name: online_grpo}}}); "
        "each stage starts from the previous stage's final policy unless it sets model.path, "
        "and runs in <run dir>/<name>. Empty: one run.",
        factory=dict,
    )

    def __post_init__(self) -> None:
        if self.agent.workflow is not None:
            _check_workflow_data(self.data)
        if self.data.task is None and self.data.path is None and self.agent.env is None:
            raise ConfigError(
                "data.task, data.path and agent.env are all null; name a task, a data file "
                "or an environment"
            )
        if self.agent.env is not None and self.reward.overlong_buffer:
            raise ConfigError(
                "agent.env is set: episodes are rewarded by the environment (and any "
                "reward.functions), so reward.overlong_buffer is not used; remove it"
            )
        if self.agent.workflow is not None:
            _check_agent_reward(
                self.reward, "agent.workflow is set: the workflow returns the reward"
            )
        if self.algo.moe_routing_replay:
            _check_routing_replay(self)
        if self.reward.overlong_buffer > self.rollout.max_new_tokens:
            raise ConfigError(
                f"reward.overlong_buffer={self.reward.overlong_buffer} exceeds "
                f"rollout.max_new_tokens={self.rollout.max_new_tokens}"
            )
        for name, overrides in self.stages.items():
            if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
                raise ConfigError(f"stages: {name!r} is not a usable stage name (a directory)")
            if not hasattr(overrides, "keys"):
                raise ConfigError(
                    f"stages.{name} must map sections to overrides, e.g. "
                    f"{{algo: {{name: sft}}}}; got {overrides!r}"
                )


def _check_routing_replay(config: ArdeaConfig) -> None:
    """Routing replay needs an engine that records routing, on rollouts it builds rows of."""
    option = "algo.moe_routing_replay=true"
    if config.rollout.engine == "vllm":
        raise ConfigError(
            f"{option} needs the experts each token was routed to; rollout.engine=vllm cannot "
            "return them (vLLM 0.32 does only from its V2 model runner, not in its CPU build, "
            "and only in non-streamed completions): use rollout.engine=in_process or "
            "algo.moe_routing_replay=false"
        )
    if config.agent.plays_episodes:
        raise ConfigError(
            f"{option} replays single-turn rollouts; agent episodes (agent.env, "
            "agent.workflow) are not recorded yet: set algo.moe_routing_replay=false"
        )


def _check_agent_reward(reward: RewardConfig, why: str) -> None:
    """Agent runs are rewarded by their environment or workflow: reward options would not
    be used."""
    if reward.functions != RewardConfig().functions or reward.overlong_buffer:
        raise ConfigError(
            f"{why}, so reward.functions and reward.overlong_buffer are not used; remove them "
            "from the config"
        )


def _check_workflow_data(data: DataConfig) -> None:
    """A workflow plays the rows of data.path; a task would not be used."""
    if data.path is None:
        raise ConfigError(
            "agent.workflow plays the rows of data.path (a .jsonl of JSON objects, one row "
            "each); set data.path (and data.eval_path for held-out rows)"
        )
    if data.task is not None:
        raise ConfigError(
            f"agent.workflow is set: data.task={data.task!r} is not used (the workflow "
            "rewards its episodes and plays data.path); set data.task=null"
        )
