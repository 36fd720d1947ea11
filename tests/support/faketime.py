"""Jump one broker's wall clock at run time, as an NTP step would, with Debian's libfaketime.

The broker runs with libfaketime preloaded and a control file (``FAKETIME_TIMESTAMP_FILE``) holding an offset
such as ``+600`` or ``-30``, read again on every clock call (``FAKETIME_NO_CACHE``); ``CLOCK_MONOTONIC`` stays
real (``FAKETIME_DONT_FAKE_MONOTONIC``), so only the wall clock (``time.time()``, ``CLOCK_REALTIME``) moves.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.broker import BrokerProcess

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SITE = Path(__file__).resolve().parent / "faketime_site"


def faketime_available() -> bool:
    return LIBFAKETIME.is_file()


class WallClock:
    """The wall-clock offset of the processes started with :meth:`env`."""

    def __init__(self, control: Path) -> None:
        if not faketime_available():  # scripts/install.sh --test installs Debian's libfaketime package
            raise RuntimeError(f"{LIBFAKETIME} is missing: install Debian's libfaketime (scripts/install.sh --test)")
        self.control = control
        self.offset_s = 0.0
        self.set(0.0)

    def env(self) -> dict[str, str]:
        """The environment of a process under this clock; ``faketime_site`` makes its ``time.sleep`` work there."""
        path = [str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])]
        return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE": str(self.control),
                "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1", "PYTHONPATH": os.pathsep.join(path)}

    def attach(self, broker: BrokerProcess) -> None:
        """Start ``broker`` (on its next start) under this clock."""
        broker.env.update(self.env())

    def set(self, offset_s: float) -> None:
        """Move the wall clock to real time plus ``offset_s``, at once (written atomically: a reader sees the old
        offset or the new one)."""
        tmp = self.control.with_name(self.control.name + ".tmp")
        tmp.write_text(f"{offset_s:+.3f}\n")
        os.replace(tmp, self.control)
        self.offset_s = offset_s
