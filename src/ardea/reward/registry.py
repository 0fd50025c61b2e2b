"""The reward-function registry: one signature for every entry.

A reward function is called on a batch::

    fn(prompts: list[str], completions: list[str], rows: list[dict]) -> list[float | None]

``prompts[i]`` is the prompt of sample ``i`` as written (a string, or a list of messages for a
conversational prompt record) and ``rows[i]`` its row: a prompt record's columns at the top
level, as in the file (``prompt``, ``answer``, any other column), or a task example's
``{"prompt", "answer", "meta"}`` (see :func:`ardea.reward.example_row`). It returns one
number per completion, or ``None`` where it cannot score one (a failed sample:
``reward.on_error``, :mod:`ardea.reward.scorer`).
Options are explicit keyword-only arguments after the three lists; :func:`make_reward`
binds them and rejects unknown or missing ones.

A function that scores token ids rather than text asks for them with one more keyword-only
parameter, ``token_ids`` (:func:`takes_token_ids`)::

    fn(prompts, completions, rows, *, token_ids: TokenIds | None = None, **options)

The scorer passes each sample's prompt and completion ids there
(:class:`~ardea.reward.token_ids.TokenIds`, the completion exactly as sampled) when its caller
has them (the rollout runner), and ``None`` when it has only text (evaluation, agent reward
terms): such a function falls back to the text then. ``token_ids`` is never an option a
config sets; a function without it is called with the three lists as before.

An entry is named by its registered name or by a dotted path ``package.module.function``
to user code.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ardea.errors import ConfigError
from ardea.registry import Registry, callable_check

RewardFn = Callable[[list[str], list[str], list[dict]], list]

REWARDS: Registry[Callable[..., list]] = Registry(
    "reward function", "reward functions", check=callable_check
)
_CHECKS: dict[str, Callable[..., None]] = {}
TOKEN_IDS = "token_ids"  # the keyword a function declares to be given the batch's token ids


def register_reward(
    name: str, *, check: Callable[..., None] | None = None
) -> Callable[[Callable[..., list]], Callable[..., list]]:
    """Decorator: make a reward function available as ``reward.functions=[{name: <name>}]``.

    ``check``, if given, is called with the keyword arguments when the function is bound
    and raises :class:`ConfigError` for bad values (e.g. a regex that does not compile).
    """

    def decorate(fn: Callable[..., list]) -> Callable[..., list]:
        REWARDS.register(name)(fn)
        if check is not None:
            _CHECKS[name] = check
        return fn

    return decorate


def reward_names() -> list[str]:
    return REWARDS.names()


def get_reward(name: str) -> Callable[..., list]:
    """The registered function ``name``, or the function at dotted path ``name``."""
    return REWARDS.get(name)


def takes_token_ids(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` declares the ``token_ids`` keyword (module docstring); False when its
    signature cannot be read. ``**kwargs`` alone does not ask for them."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    return any(  # keyword-only, or positional after (prompts, completions, rows)
        p.name == TOKEN_IDS
        and (p.kind is p.KEYWORD_ONLY or (p.kind is p.POSITIONAL_OR_KEYWORD and i >= 3))
        for i, p in enumerate(params)
    )


def _options(name: str, fn: Callable[..., list]) -> tuple[list[str], list[str], bool] | None:
    """(allowed, required) keyword names and whether any keyword is accepted; None when
    the signature cannot be read. Raises if ``fn`` cannot take the three lists."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 3 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise ConfigError(
            f"reward function {name!r} must take (prompts, completions, rows); "
            f"its signature is {inspect.signature(fn)}"
        )
    extra = positional[3:] + [p for p in params if p.kind is p.KEYWORD_ONLY]
    extra = [p for p in extra if p.name != TOKEN_IDS]  # given by the scorer, not configured
    allowed = [p.name for p in extra]
    required = [p.name for p in extra if p.default is p.empty]
    return allowed, required, any(p.kind is p.VAR_KEYWORD for p in params)


def make_reward(name: str, **kwargs: Any) -> RewardFn:
    """``name`` (registered or dotted path) with its keyword arguments bound.

    The result takes ``(prompts, completions, rows)`` (and ``token_ids=`` when ``fn``
    declares it, :func:`takes_token_ids`) and is named ``name`` (the last component of a
    dotted path), which is how the scorer reports it.

    Raises:
        ConfigError: unknown name, a path that does not import, an unknown or missing
            keyword argument (``token_ids`` is the scorer's, never one), or a value the
            function's check rejects.
    """
    fn = get_reward(name)
    if TOKEN_IDS in kwargs:
        raise ConfigError(
            f"reward function {name!r}: {TOKEN_IDS} is passed by the scorer (the rollout's "
            "token ids), not set in reward.functions[].kwargs"
        )
    options = _options(name, fn)
    if options is not None:
        allowed, required, any_keyword = options
        unknown = sorted(set(kwargs) - set(allowed))
        if unknown and not any_keyword:
            raise ConfigError(
                f"unknown argument(s) {', '.join(unknown)} for reward function {name!r}; "
                f"allowed: {', '.join(allowed) or '(none)'}"
            )
        missing = [k for k in required if k not in kwargs]
        if missing:
            raise ConfigError(
                f"reward function {name!r} needs the argument(s) {', '.join(missing)} "
                "(reward.functions[].kwargs)"
            )
    if name in _CHECKS:
        _CHECKS[name](**kwargs)

    if takes_token_ids(fn):

        def bound(
            prompts: list[str], completions: list[str], rows: list[dict], *, token_ids=None
        ) -> list:
            return fn(prompts, completions, rows, token_ids=token_ids, **kwargs)

    else:

        def bound(prompts: list[str], completions: list[str], rows: list[dict]) -> list:
            return fn(prompts, completions, rows, **kwargs)

    bound.__name__ = bound.__qualname__ = name.rpartition(".")[2]
    bound.__doc__ = fn.__doc__
    return bound
