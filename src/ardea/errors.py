"""Error types for bad user input.

Every layer raises a subclass of :class:`ArdeaError` (itself a ``ValueError``) for
input the user can fix: a config value, a data file, a model directory. The CLI
prints such errors as one line, without a traceback, and exits non-zero; anything
else is a bug and keeps its traceback.
"""


class ArdeaError(ValueError):
    """Bad user input; the message names the field, file or value and the fix."""


class ConfigError(ArdeaError):
    """An invalid configuration: unknown key, wrong type or invalid value."""
