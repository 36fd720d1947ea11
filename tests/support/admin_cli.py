"""Running the admin CLI in tests. ``run`` calls the click app in this process (a command costs its own work,
not a Python start and the imports, about half a second of CPU each); ``run_process`` runs
``python -m pykbroker`` as a user does, for what only the entry point shows (routing, completion)."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path

from click.testing import CliRunner

from pykbroker.admin.app import root

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0


def _env(extra: Mapping[str, str] | None) -> dict[str, str | None]:
    """The environment of one command: none of the runner's own PYKBROKER_* settings, plus ``extra``."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("PYKBROKER_")}
    env.update(extra or {})
    return env


def run(args: list[str], stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """The click app in this process, its output captured; an exception that escapes the command fails the
    test with its traceback (a command must turn every failure into an exit code)."""
    result = CliRunner().invoke(root, args, input=stdin, env=_env(env), catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        trace = "".join(traceback.format_exception(result.exception))
        raise AssertionError(f"pykbroker {' '.join(args)} raised:\n{trace}")
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout_bytes, result.stderr_bytes)


def run_process(args: list[str], stdin: bytes | str | None = None,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """``python -m pykbroker ARGS`` in a subprocess, bounded in time."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
    full.update(env or {})
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run([sys.executable, "-m", "pykbroker", *args], input=data, capture_output=True,
                          timeout=TIMEOUT, cwd=ROOT, env=full, check=False)
