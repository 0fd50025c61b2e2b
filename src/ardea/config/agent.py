"""The ``agent`` section: multi-turn episodes in an environment instead of single prompts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ardea.config.fields import check_choices, check_range, option
from ardea.errors import ConfigError

EXPORT_STYLES = ("conversation", "call")
HISTORY_POLICIES = ("error", "new_trajectory", "keep_tokens")
TOOL_PARSER_NAMES = ("hermes", "llama3_json", "mistral", "deepseek_v3")  # agent/tool_parsers.py


@dataclass
class AgentConfig:
    env: str | None = option(
        None,
        "Environment by registered name (guess_number, calculator) or dotted path "
        "package.module.Class to an ardea.agent.Environment subclass; the run's data are its "
        "rows and online strategies play episodes in it. null: not an agent run.",
    )
    workflow: str | None = option(
        None,
        "Agent workflow: the user's async def run(client, row) -> reward | {reward, ...}, "
        "named package.module.function or path/to/file.py:function; client is an "
        "openai.AsyncOpenAI served by the policy, row a row of data.path (JSON objects). "
        "Online strategies run rollout.group_size workflows per row. null: none.",
    )
    transport: str = option(
        "in_process",
        "How a workflow's client reaches the policy: in_process (no socket) or http (the "
        "recording server on 127.0.0.1). The calls and samples are the same.",
        choices=("in_process", "http"),
    )
    max_concurrency: int = option(
        256, "Most workflow episodes running at once (each row's G episodes, row after row)."
    )
    workflow_timeout_s: float = option(
        300.0,
        "Seconds one workflow episode may take (model calls included); past it the episode "
        "is cancelled and counted as failed (agent/workflow_timeouts), its calls not trained.",
    )
    env_args: dict[str, Any] = option(
        help="Keyword arguments of the environment, e.g. {high: 8}; unknown ones are errors.",
        factory=dict,
    )
    max_turns: int = option(4, "Most model replies per episode (the episode ends there).")
    retries: int = option(
        1,
        "Times an episode whose environment or workflow failed (raised, timed out) is played "
        "again from a fresh environment with the same row and random numbers before "
        "reward.on_error applies (mask: counted, not trained; fail: stop). Leaving failed "
        "episodes out biases a group towards the ones that survived; a transient failure "
        "(a flaky server, a sandbox that died) does not recur, a deterministic one costs one "
        "more attempt. Counted in agent/retries.",
    )
    export: str = option(
        "conversation",
        "How episodes become trajectories: conversation (one row per episode, every reply a "
        "turn) or call (one row per model call, with the discounted reward).",
        choices=EXPORT_STYLES,
    )
    history: str = option(
        "error",
        "When a call's prompt would not extend the previous call's tokens (a chat template "
        "that rewrote history, e.g. Qwen3's dropping <think> blocks, or agent code that "
        "rewrites its own turns): error; new_trajectory (start a new row there); or "
        "keep_tokens (keep the tokens the model saw and generated and append only the new "
        "messages, so the conversation stays one row; the model then sees its earlier turns "
        "as generated, not as the template would re-render them).",
        choices=HISTORY_POLICIES,
    )
    tool_parser: str = option(
        "hermes",
        "How the model writes a tool call: hermes (<tool_call>{json}</tool_call>: Hermes, "
        "Qwen, ardea's tiny template), llama3_json, mistral, deepseek_v3 (vLLM's names for "
        "the same formats), auto (from the tokenizer's chat template, when it holds one "
        "family's markers) or a dotted path to an ardea.agent.ToolParser subclass.",
    )
    executor: str = option(
        "thread",
        "Where the environment's tools run: thread (a call past its timeout is abandoned "
        "and keeps running) or process (each call in a forked child process, killed at the "
        "timeout; a tool that ends its process fails that call only). Environment steps "
        "stay in the runner's process: they change the environment's state.",
        choices=("thread", "process"),
    )
    eval_episodes: int = option(
        1,
        "Episodes per held-out row at each evaluation: 1 plays one greedy episode; more play "
        "that many sampled at rollout.temperature with the same seed at every evaluation "
        "(the success rate of the sampling policy, averaged).",
    )
    reward_discount: float = option(
        1.0,
        "export=call: a call's reward is its own plus reward_discount times the next call's "
        "(a final reward reaches the call k turns earlier as discount^k).",
    )

    @property
    def plays_episodes(self) -> bool:
        """Whether the run plays episodes (``env`` or ``workflow`` set) rather than
        sampling completions of prompts."""
        return self.env is not None or self.workflow is not None

    def __post_init__(self) -> None:
        check_choices(self, "agent")
        if self.env is not None and (not isinstance(self.env, str) or not self.env):
            raise ConfigError(f"agent.env={self.env!r} must name an environment or be null")
        if not hasattr(self.env_args, "keys"):
            raise ConfigError(f"agent.env_args={self.env_args!r} must map option names to values")
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int):
            raise ConfigError(f"agent.max_turns={self.max_turns!r} must be an int >= 1")
        check_range("agent.max_turns", self.max_turns, low=1)
        if isinstance(self.retries, bool) or not isinstance(self.retries, int):
            raise ConfigError(f"agent.retries={self.retries!r} must be an int >= 0")
        check_range("agent.retries", self.retries, low=0)
        if isinstance(self.eval_episodes, bool) or not isinstance(self.eval_episodes, int):
            raise ConfigError(f"agent.eval_episodes={self.eval_episodes!r} must be an int >= 1")
        check_range("agent.eval_episodes", self.eval_episodes, low=1)
        if self.workflow is not None and (not isinstance(self.workflow, str) or not self.workflow):
            raise ConfigError(f"agent.workflow={self.workflow!r} must name a function or be null")
        if self.workflow is not None and self.env is not None:
            raise ConfigError(
                f"agent.env={self.env!r} and agent.workflow={self.workflow!r} are both set; an "
                "agent run plays an environment or a workflow: set the other to null"
            )
        if self.workflow is not None and self.env_args:
            raise ConfigError(
                f"agent.env_args={dict(self.env_args)!r} configures an agent.env; a workflow "
                "reads its options from its rows (data.path): remove env_args"
            )
        if isinstance(self.max_concurrency, bool) or not isinstance(self.max_concurrency, int):
            raise ConfigError(f"agent.max_concurrency={self.max_concurrency!r} must be an int >= 1")
        check_range("agent.max_concurrency", self.max_concurrency, low=1)
        check_range("agent.workflow_timeout_s", self.workflow_timeout_s, low=0.0, low_open=True)
        if self.tool_parser not in (*TOOL_PARSER_NAMES, "auto") and "." not in self.tool_parser:
            raise ConfigError(
                f"agent.tool_parser={self.tool_parser!r}: choose {', '.join(TOOL_PARSER_NAMES)}, "
                "auto, or a dotted path package.module.Class"
            )
        check_range("agent.reward_discount", self.reward_discount, low=0.0, high=1.0)
        if self.reward_discount != 1.0 and self.export != "call":
            raise ConfigError(
                f"agent.reward_discount={self.reward_discount} discounts rewards between the "
                f"calls of an episode, which only agent.export=call trains one by one (it is "
                f"{self.export!r}): set agent.export=call or remove agent.reward_discount"
            )
