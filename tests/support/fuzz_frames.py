"""Decode mutated frames of every advertised (API, version) in-process through ``Dispatcher.parse``.

Run it under an address-space limit, so an allocation sized by a lying length aborts
this process (a failure the caller sees) rather than the machine running dry::

    prlimit --as=2147483648 .venv/bin/python -m tests.support.fuzz_frames --frames 3000000

It prints one JSON line of counts and exits 1 when ``parse`` raised anything but
``CloseConnection``, closed the connection because of a MemoryError, or decoded a body
whose end kio and the bounds pre-pass disagree on.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any, cast

from pykbroker.protocol import codec
from pykbroker.protocol.bounds import check_request, request_walker
from pykbroker.protocol.framing import CloseConnection
from pykbroker.server.context import Services
from pykbroker.server.dispatcher import Dispatcher
from tests.support.hostile import HUGE_ARRAY_FRAME, mutated_frames


def run(frames: int, seed: int) -> dict[str, Any]:
    # parse() reads only which optional APIs are served (an unsupported ApiVersions is answered with the
    # advertised list): a broker without share groups, with the client telemetry APIs.
    dispatcher = Dispatcher(cast(Services, SimpleNamespace(
        shares=None, config={"pykbroker.client.telemetry.enable": "true"})))
    outcome: Counter[str] = Counter()
    failures: list[str] = []
    started = time.monotonic()
    seen = 0
    for api_key, version, frame in itertools.chain([(3, 12, HUGE_ARRAY_FRAME[4:])], mutated_frames(frames, seed)):
        seen += 1
        try:
            parsed = dispatcher.parse(frame)
            outcome["decoded"] += 1
            if not isinstance(parsed, bytes):
                # The pre-pass and kio must agree on where the body ends, or kio could read a
                # length the pre-pass never checked.
                # Both read the frame as decoded: without the tagged fields the schema does not know.
                header = parsed[0]
                decoded = check_request(header.api_key, header.api_version, frame, header.body_offset)
                if decoded is not frame:
                    outcome["decoded without unknown tagged fields"] += 1
                walked = request_walker(header.api_key, header.api_version)(decoded, header.body_offset,
                                                                            len(decoded))
                cls = codec.request_class(header.api_key, header.api_version)
                _value, size = codec._reader(cls)(decoded, header.body_offset)
                if walked != header.body_offset + size:
                    failures.append(f"api {api_key} v{version}: pre-pass ends at {walked}, kio at "
                                    f"{header.body_offset + size}: frame={frame.hex()}")
        except CloseConnection as e:
            reason = str(e)
            if "MemoryError" in reason:
                failures.append(f"api {api_key} v{version}: {reason} frame={frame.hex()}")
            outcome["rejected before decoding" if "before decoding" in reason else "closed"] += 1
        except BaseException as e:  # anything else is the failure being looked for
            failures.append(f"api {api_key} v{version}: {e!r} frame={frame.hex()}")
        if len(failures) >= 20:
            break
    return {
        "frames": seen,
        "outcome": dict(outcome),
        "failures": failures,
        "seconds": round(time.monotonic() - started, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--frames", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    result = run(args.frames, args.seed)
    print(json.dumps(result), flush=True)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
