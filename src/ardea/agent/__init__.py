"""Agents: multi-turn interactions, environments with tools, the OpenAI-compatible
recording client and the episode runner (``interaction`` for calls and their export into
trajectories, ``conversation`` for appending a call to its parent's tokens, ``tools`` for
tool calls, ``env`` for the environment protocol and registry, ``builtin_envs`` for
``guess_number`` and ``calculator``, ``reply`` for a reply parsed once, ``calls`` and
``lockstep`` for how and when calls go to the engine, ``client`` and ``server`` for the
chat-completions interface in process and over HTTP, ``episodes`` for G episodes per
environment row, ``workflows`` for the user's own agent code).

Beside ``rollout`` in the layers: imports rollout, data, reward, model, algo and config.
"""

from ardea.agent import builtin_envs  # noqa: F401  (registers the built-in environments)
from ardea.agent.env import (
    ENVIRONMENTS,
    Environment,
    StepResult,
    check_env_args,
    env_class,
    make_env,
    register_env,
)
from ardea.agent.interaction import (
    EXPORT_STYLES,
    HISTORY_POLICIES,
    HistoryRewriteError,
    Interaction,
    discount_rewards,
    export_trajectories,
)
from ardea.agent.reply import Reply
from ardea.agent.tool_parsers import TOOL_PARSERS, ToolParser, make_tool_parser
from ardea.agent.tools import (
    ToolBox,
    ToolCall,
    ToolResult,
    ToolSandboxError,
    parse_tool_calls,
    tool_schema,
)

__all__ = [
    "ENVIRONMENTS",
    "EXPORT_STYLES",
    "HISTORY_POLICIES",
    "ChatRequest",
    "Environment",
    "HistoryRewriteError",
    "TOOL_PARSERS",
    "ToolParser",
    "Interaction",
    "RecordingClient",
    "Reply",
    "StepResult",
    "ToolBox",
    "ToolCall",
    "ToolResult",
    "ToolSandboxError",
    "check_env_args",
    "discount_rewards",
    "env_class",
    "export_trajectories",
    "make_env",
    "make_tool_parser",
    "parse_tool_calls",
    "register_env",
    "tool_schema",
]

#: the names of the client, imported when first asked for: the client imports ``openai``,
#: which a run with an environment alone never needs
_CLIENT_NAMES = ("ChatRequest", "RecordingClient")


def __getattr__(name: str):
    if name in _CLIENT_NAMES:
        from ardea.agent import client

        return getattr(client, name)
    raise AttributeError(f"module 'ardea.agent' has no attribute {name!r}")
