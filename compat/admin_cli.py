"""pykbroker's admin CLI as a compat client: the same command lines against pykbroker and against Apache Kafka.

Each invocation is ``python -m pykbroker ...`` in a subprocess with ``-b`` pointed at the cluster under test,
bounded in time; its exit code, stdout (a JSON document with ``-o json``) and stderr are kept for the checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLIENT = "pykbroker-cli"
TIMEOUT = 90.0


@dataclass
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def doc(self) -> Any:
        return json.loads(self.stdout)

    def __str__(self) -> str:
        return f"{' '.join(self.argv)} -> {self.returncode}\n{self.stdout[-2000:]}\n{self.stderr[-2000:]}"


class AdminCli:
    def __init__(self, bootstrap: str, sasl_bootstrap: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.sasl_bootstrap = sasl_bootstrap

    def run(self, *args: str, stdin: str | None = None, login: tuple[str, str, str] | None = None) -> Result:
        """``pykbroker ARGS -b <cluster>``; with ``login`` (mechanism, user, password) on the SASL listener."""
        argv = [*args]
        if login is None:
            argv += ["-b", self.bootstrap]
        else:
            assert self.sasl_bootstrap is not None
            mechanism, user, password = login
            argv += ["-b", self.sasl_bootstrap, "-X", "security.protocol=SASL_PLAINTEXT", "-X",
                     f"sasl.mechanism={mechanism}", "-X", f"sasl.username={user}", "-X", f"sasl.password={password}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
        p = subprocess.run([sys.executable, "-m", "pykbroker", *argv], input=stdin, capture_output=True, text=True,
                           timeout=TIMEOUT, cwd=ROOT, env=env)
        return Result(["pykbroker", *argv], p.returncode, p.stdout, p.stderr)

    def ok(self, *args: str, stdin: str | None = None, login: tuple[str, str, str] | None = None) -> Result:
        r = self.run(*args, stdin=stdin, login=login)
        assert r.returncode == 0, str(r)
        return r

    def json(self, *args: str, stdin: str | None = None, login: tuple[str, str, str] | None = None) -> Any:
        return self.ok(*args, "-o", "json", stdin=stdin, login=login).doc
