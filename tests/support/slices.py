"""Whether this kernel keeps a scheduler slice per thread (Linux 6.12+), for the tests of
pykbroker.scheduler.slice.us."""

from __future__ import annotations

import subprocess
import sys

_PROBE = "from pykbroker.server.cpu_slice import request_time_slice as r\ntry:\n r(300)\nexcept Exception:\n exit(3)"


def kernel_keeps_slices() -> bool:
    """Asked in a child process, so that the test process keeps its own slice."""
    return subprocess.run([sys.executable, "-c", _PROBE], timeout=60).returncode == 0
