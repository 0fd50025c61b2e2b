"""Named registries: entries added by a decorator, looked up by name or dotted path.

Strategies, tasks, advantage estimators, policy losses, reward functions, environments and
generation engines are each one :class:`Registry`. A config names an entry by its
registered name or by the dotted path ``package.module.name`` of user code; an unknown name
is a :class:`ConfigError` that lists the known ones, so every registry answers a typo the
same way. Like :mod:`ardea.errors`, this module imports nothing of ardea's layers, so every
layer may use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from ardea.errors import ConfigError

Entry = TypeVar("Entry")


def import_dotted(path: str, where: str) -> object:
    """The object at ``package.module.name``; a ConfigError starting with ``where`` (the
    config field, e.g. ``agent.env='pkg.Env'``) when the module cannot be imported (whatever
    it raised on import) or has no such name."""
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"{where}: not a dotted path package.module.name")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or anything the user's module raises on import
        raise ConfigError(
            f"{where}: cannot import module {module_name!r} ({type(err).__name__}: {err})"
        ) from err
    if not hasattr(module, attr):
        raise ConfigError(f"{where}: module {module_name!r} has no {attr!r}")
    return getattr(module, attr)


class Registry(Generic[Entry]):
    """Entries by name, for the config field ``field`` (e.g. ``agent.env``; empty for
    registries whose callers name the field themselves).

    ``check(name, entry)`` raises ConfigError when ``entry`` cannot serve here (not a
    subclass of the right base, a missing attribute); it runs on registration and on every
    entry imported by dotted path. Registering a name twice is a ValueError (a bug, not
    bad input).
    """

    def __init__(
        self,
        kind: str,
        plural: str,
        *,
        field: str = "",
        check: Callable[[str, Entry], None] | None = None,
    ) -> None:
        self.kind = kind
        self.plural = plural
        self.field = field
        self._check = check
        self._entries: dict[str, Entry] = {}

    def register(self, name: str) -> Callable[[Entry], Entry]:
        """Decorator adding the decorated class or function as ``name``."""

        def decorate(entry: Entry) -> Entry:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            if self._check is not None:
                self._check(name, entry)
            self._entries[name] = entry
            return entry

        return decorate

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests that register a throwaway entry clean up with this)."""
        self._entries.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def _where(self, name: str) -> str:
        return f"{self.field}={name!r}" if self.field else repr(name)

    def get(self, name: str) -> Entry:
        """The entry registered as ``name``, or the object at dotted path ``name``.

        Raises:
            ConfigError: ``name`` is not a string, not registered and not importable (the
                message lists the registered names), or fails the registry's check.
        """
        if not isinstance(name, str):
            raise ConfigError(f"a {self.kind} is named by a string, got {name!r}")
        if name in self._entries:
            return self._entries[name]
        where = self._where(name)
        if "." not in name.strip("."):
            raise ConfigError(
                f"unknown {self.kind} {where}; known {self.plural}: {', '.join(self.names())} "
                "(or a dotted path package.module.name to your own)"
            )
        entry = import_dotted(name, f"{self.kind} {where}")
        if self._check is not None:
            self._check(name, entry)  # type: ignore[arg-type]
        return entry  # type: ignore[return-value]


def subclass_check(base: type, what: str) -> Callable[[str, object], None]:
    """A :class:`Registry` check: the entry is a subclass of ``base`` (``what`` names it in
    the message, e.g. ``ardea.agent.Environment``)."""

    def check(name: str, entry: object) -> None:
        if not (isinstance(entry, type) and issubclass(entry, base)):
            raise ConfigError(f"{name!r} is {entry!r}, not a subclass of {what}")

    return check


def callable_check(name: str, entry: object) -> None:
    """A :class:`Registry` check: the entry can be called."""
    if not callable(entry):
        raise ConfigError(f"{name!r} is a {type(entry).__name__}, not a function")
