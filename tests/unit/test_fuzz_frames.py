"""Hundreds of thousands of mutated frames of every advertised (API, version) through ``Dispatcher.parse``.

The decoding runs in a subprocess under ``prlimit --as`` (2 GiB of address space), so a frame
that makes kio size an allocation from a lying length aborts that subprocess, which fails this
test, instead of taking pytest or the machine with it.  CI runs 200,000 frames; millions are
one environment variable away::

    PYKB_FUZZ_FRAMES=3000000 .venv/bin/pytest -p no:cacheprovider -q tests/unit/test_fuzz_frames.py

(``PYKB_``, not ``PYKBROKER_``: the broker reads every ``PYKBROKER_*`` variable as a config key.)
``PYKB_FUZZ_SEED`` picks another stream of mutations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADDRESS_SPACE = 2 << 30
FRAMES = int(os.environ.get("PYKB_FUZZ_FRAMES", "200000"))
SEED = int(os.environ.get("PYKB_FUZZ_SEED", "20261123"))


def _limited(code_or_module: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["prlimit", f"--as={ADDRESS_SPACE}", "--", sys.executable, *code_or_module],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
    )


def test_mutated_frames_of_every_pair_never_crash_the_decoder() -> None:
    # About 20 µs a frame on one core; the timeout leaves room for a loaded CI machine.
    proc = _limited(["-m", "tests.support.fuzz_frames", "--frames", str(FRAMES), "--seed", str(SEED)],
                    timeout=60 + FRAMES / 1000)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout[-4000:]}\nstderr: {proc.stderr[-4000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["frames"] == FRAMES + 1  # the 21-byte frame first, then the mutations
    outcome = result["outcome"]
    # The mix shows the mutations reach every stage: refused by the pre-pass, closed by header or
    # kio errors, and decoded (a mutation that still makes a valid request).
    assert outcome["rejected before decoding"] > FRAMES // 10, outcome
    assert outcome["decoded"] > FRAMES // 20, outcome
    assert outcome["closed"] > FRAMES // 20, outcome


def test_the_limit_turns_an_unchecked_decode_into_a_visible_failure() -> None:
    """Without the pre-pass, kio aborts on the 21-byte frame: the harness above would see it.

    If a kio release starts refusing such lengths itself, this fails and says so; the pre-pass
    then stays as defence in depth.
    """
    code = (
        "from pykbroker.protocol import codec\n"
        "from tests.support.hostile import HUGE_ARRAY_FRAME\n"
        "codec.decode_request(3, 12, HUGE_ARRAY_FRAME[4:], 12)\n"
    )
    proc = _limited(["-c", code], timeout=60)
    assert proc.returncode != 0, "kio decoded the 21-byte frame without aborting: it may bound lengths itself"
    assert "memory allocation" in proc.stderr or proc.returncode in (-6, 134), proc.stderr[-2000:]
