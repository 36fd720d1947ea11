"""Fixtures for the container-image tests: podman prerequisites, the image built from this working tree."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.docker import podman as pm


def _prerequisites_missing() -> list[str]:
    missing = []
    if shutil.which("podman") is None:
        missing.append("podman")
    elif pm.podman("image", "exists", pm.BASE_IMAGE, check=False).returncode != 0:
        missing.append(f"base image {pm.BASE_IMAGE}")
    if pm.compose_binary() is None:
        missing.append("podman-compose")
    return missing


def _ensure_prerequisites() -> None:
    missing = _prerequisites_missing()
    if not missing:
        return
    if os.geteuid() != 0:
        pytest.fail(f"missing {', '.join(missing)}: run `sudo {pm.SETUP_SCRIPT}` first", pytrace=False)
    # The test command runs the setup script before pytest; this is the fallback when it did not.
    cp = subprocess.run(["bash", str(pm.SETUP_SCRIPT)], capture_output=True, text=True, timeout=900,
                        env=pm.env(), stdin=subprocess.DEVNULL)
    if cp.returncode != 0:
        pytest.fail(f"{pm.SETUP_SCRIPT} failed:\n{cp.stdout}\n{cp.stderr}", pytrace=False)
    still = _prerequisites_missing()
    if still:
        pytest.fail(f"still missing after setup: {', '.join(still)}", pytrace=False)


@pytest.fixture(scope="session")
def image() -> str:
    """The pykbroker image, built with podman from the working tree (layer cache reused between runs)."""
    _ensure_prerequisites()
    with pm.file_lock("pykbroker-docker-build.lock"):
        cmd = ["build", "--pull=never", "--format", "docker", "--layers", "--file", str(pm.DOCKERFILE),
               "--tag", pm.IMAGE]
        ca = pm.host_ca_bundle()
        if ca:
            cmd += ["--secret", f"id=build-ca,src={ca}"]
        t0 = time.monotonic()
        cp = pm.podman(*cmd, str(pm.REPO_ROOT), timeout=900, check=False)
        elapsed = time.monotonic() - t0
        if cp.returncode != 0:
            tail = "\n".join((cp.stdout + cp.stderr).splitlines()[-60:])
            pytest.fail(f"podman build failed ({cp.returncode}):\n{tail}", pytrace=False)
        cached = (cp.stdout + cp.stderr).count("Using cache")
        size = int(pm.podman("image", "inspect", "--format", "{{.Size}}", pm.IMAGE).stdout.strip())
    pm.record_figure("build_seconds", round(elapsed, 1))
    pm.record_figure("build_cached_steps", cached)
    pm.record_figure("image_size_mb", round(size / 1e6, 1))
    return pm.IMAGE


@pytest.fixture
def containers(image: str) -> Iterator[pm.Containers]:
    c = pm.Containers()
    try:
        yield c
    finally:
        c.cleanup()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        with contextlib.suppress(FileNotFoundError):
            pm.FIGURES_FILE.unlink()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not pm.FIGURES_FILE.exists():
        return
    try:
        figures = json.loads(pm.FIGURES_FILE.read_text())
    except ValueError:
        return
    terminalreporter.section("pykbroker container image")
    for key, value in sorted(figures.items()):
        terminalreporter.write_line(f"{key}: {value}")
