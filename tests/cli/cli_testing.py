"""Running the real ``ardea`` command line in a subprocess, for the CLI tests."""

import os
import subprocess
import sys


def run_cli(*args: str, cwd, timeout: float = 900, env=None) -> subprocess.CompletedProcess:
    """``python -m ardea.cli.main ARGS`` in ``cwd``, with ``env`` added to this process's
    environment; output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "ardea.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )


def ardea(*args: str, cwd, timeout: float = 900, env=None) -> subprocess.CompletedProcess:
    """:func:`run_cli` that must succeed (its output shown when it does not)."""
    result = run_cli(*args, cwd=cwd, timeout=timeout, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result
