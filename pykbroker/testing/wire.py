"""The few admin requests a test harness needs, sent over a plain socket with pykbroker's own codec, so that
starting a broker and making a topic need no client library. Every call is bounded by a timeout.

The codec (kio's schemas) is imported when a request is first made: a test run with the plugin on and no
test that needs a broker does not pay for it."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Mapping
from typing import Any

from pykbroker.protocol.framing import encode_frame
from pykbroker.protocol.header import encode_request_header

API_VERSIONS, METADATA, CREATE_TOPICS, DELETE_TOPICS = 18, 3, 19, 20
# Versions every pykbroker answers; each is flexible (request header v2, response header v1).
METADATA_VERSION, CREATE_TOPICS_VERSION, DELETE_TOPICS_VERSION = 12, 5, 4
UNKNOWN_TOPIC_OR_PARTITION, NOT_CONTROLLER = 3, 41
CLIENT_ID = "pykbroker-testing"


class WireError(Exception):
    """A broker answered a request with an error code."""

    def __init__(self, what: str, code: int, message: str | None = None) -> None:
        # Imported on the first error, as the codec below: importing kio takes about 0.4 s.
        from kio.schema.errors import ErrorCode

        self.code = code
        try:
            name = ErrorCode(code).name.upper()
        except ValueError:
            name = "UNKNOWN"
        super().__init__(f"{what}: {name} ({code})" + (f": {message}" if message else ""))


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes (each receive brings at least one, so at most ``n`` receives)."""
    buf = bytearray()
    for _ in range(n + 1):
        if len(buf) >= n:
            break
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the broker closed the connection without answering")
        buf += chunk
    return bytes(buf)


def request(address: str, api_key: int, version: int, body: Mapping[str, Any], timeout: float = 10.0, *,
            client_id: str = CLIENT_ID) -> Any:
    """One request of a flexible version on a fresh connection; the decoded response."""
    # Loaded on the first request, not when the pytest plugin is imported: the codec (kio) takes a while.
    from pykbroker.protocol import codec

    correlation_id = 1
    body_bytes = codec.encode_entity(codec.build(codec.request_class(api_key, version), body))
    payload = encode_request_header(api_key, version, correlation_id, client_id, True) + body_bytes
    with socket.create_connection(split_address(address), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(encode_frame(payload))
        (size,) = struct.unpack(">i", recv_exact(sock, 4))
        frame = recv_exact(sock, size)
    (answered,) = struct.unpack_from(">i", frame, 0)
    if answered != correlation_id:
        raise ConnectionError(f"{address} answered correlation id {answered}, not {correlation_id}")
    if frame[4] != 0:
        raise ConnectionError(f"{address} answered with tagged fields in the response header")
    # Response header v1: the correlation id, then tagged fields (none from pykbroker: one zero byte).
    return codec.decode_response(api_key, version, frame, 5)


def api_versions_ok(address: str, timeout: float = 1.0) -> bool:
    """An ApiVersions v0 round trip answered with no error: the broker reads and answers requests."""
    request_bytes = encode_request_header(API_VERSIONS, 0, 1, CLIENT_ID, False)
    try:
        with socket.create_connection(split_address(address), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(encode_frame(request_bytes))
            (size,) = struct.unpack(">i", recv_exact(sock, 4))
            if not 10 <= size < 1 << 20:
                return False
            body = recv_exact(sock, size)
    except (OSError, ConnectionError):
        return False
    correlation_id, error_code, count = struct.unpack_from(">ihi", body, 0)
    return correlation_id == 1 and error_code == 0 and count > 0


def metadata(address: str, topics: list[str] | None = None, timeout: float = 10.0) -> Any:
    """Metadata v12 of ``topics`` (None: all), never creating a topic."""
    body = {"topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
            "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
    return request(address, METADATA, METADATA_VERSION, body, timeout)


def _controller(bootstrap: list[str], timeout: float) -> str:
    """The address of the controller, which Kafka's admin requests go to (any broker that answers tells)."""
    last: Exception | None = None
    for address in bootstrap:
        try:
            md = metadata(address, [], timeout)
        except (OSError, ConnectionError) as e:
            last = e
            continue
        for b in md.brokers:
            if b.node_id == md.controller_id:
                return f"{b.host}:{b.port}"
        return address
    raise ConnectionError(f"no broker of {','.join(bootstrap)} answered Metadata: {last}")


def _admin(bootstrap: str, api_key: int, version: int, body: Mapping[str, Any], timeout: float) -> Any:
    """An admin request to the controller, again to the new one if the controller moved (bounded in time)."""
    addresses = [a.strip() for a in bootstrap.split(",") if a.strip()]
    deadline = time.monotonic() + timeout
    for _ in range(100):
        response = request(_controller(addresses, timeout), api_key, version, body, timeout)
        results = response.topics if api_key == CREATE_TOPICS else response.responses
        if all(int(r.error_code) != NOT_CONTROLLER for r in results) or time.monotonic() > deadline:
            return response
        time.sleep(0.1)
    return response


def wait_topic(bootstrap: str, name: str, partitions: int, timeout: float = 30.0) -> None:
    """Until every broker of ``bootstrap`` shows the topic with ``partitions`` partitions, each with a leader."""
    addresses = [a.strip() for a in bootstrap.split(",") if a.strip()]
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    for _ in range(int(timeout / 0.05) + 2):
        ready = 0
        for address in addresses:
            try:
                md = metadata(address, [name], min(5.0, timeout))
            except (OSError, ConnectionError) as e:
                last = f"{address}: {e}"
                break
            shown = [t for t in md.topics if t.name == name and int(t.error_code) == 0]
            if not shown or len(shown[0].partitions) != partitions \
                    or any(p.leader_id < 0 for p in shown[0].partitions):
                last = f"{address} does not show {partitions} partition(s) with leaders yet"
                break
            ready += 1
        if ready == len(addresses):
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    raise TimeoutError(f"topic {name} not ready within {timeout:g} s: {last}")


def create_topic(bootstrap: str, name: str, partitions: int = 1, replication_factor: int = -1,
                 config: Mapping[str, str] | None = None, timeout: float = 30.0) -> None:
    """Create a topic with CreateTopics, then wait until all of ``bootstrap``'s brokers show it with leaders.

    ``replication_factor=-1`` takes the broker's ``default.replication.factor``."""
    topic = {"name": name, "num_partitions": partitions, "replication_factor": replication_factor,
             "assignments": [], "configs": [{"name": k, "value": v} for k, v in (config or {}).items()]}
    body = {"topics": [topic], "timeout": int(timeout * 1000), "validate_only": False}
    response = _admin(bootstrap, CREATE_TOPICS, CREATE_TOPICS_VERSION, body, timeout)
    for result in response.topics:
        if int(result.error_code) != 0:
            raise WireError(f"CreateTopics {result.name}", int(result.error_code), result.error_message)
    wait_topic(bootstrap, name, partitions, timeout)


def delete_topic(bootstrap: str, name: str, timeout: float = 30.0, missing_ok: bool = True) -> None:
    """Delete a topic with DeleteTopics; a topic that does not exist is fine when ``missing_ok``."""
    body = {"topic_names": [name], "timeout": int(timeout * 1000)}
    response = _admin(bootstrap, DELETE_TOPICS, DELETE_TOPICS_VERSION, body, timeout)
    for result in response.responses:
        code = int(result.error_code)
        if code == 0 or (missing_ok and code == UNKNOWN_TOPIC_OR_PARTITION):
            continue
        raise WireError(f"DeleteTopics {result.name}", code, getattr(result, "error_message", None))
