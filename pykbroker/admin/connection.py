"""One connection to one broker over pykbroker's own codec, for the Admin APIs librdkafka lacks: TLS and SASL
(PLAIN, SCRAM) from the same librdkafka properties as every other command, ApiVersions first so that each request
goes at the highest version both sides know, and every socket operation bounded by the command's timeout."""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Mapping
from typing import Any

from pykbroker import __version__
from pykbroker.protocol.framing import encode_frame
from pykbroker.protocol.header import encode_request_header, skip_tagged_fields
from pykbroker.security.sasl.scram import SaslFailure, ScramClient

from .errors import EXIT_FAILED, EXIT_UNREACHABLE, AdminError, error_name

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
CLIENT_ID = "pykbroker-admin"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
UNSUPPORTED_VERSION = 35
_MAX_FRAME = 100 * 1024 * 1024


def _codec() -> Any:
    """The codec, imported on the first request: importing kio takes about half a second, which the admin
    commands' --help and shell completion should not pay."""
    from pykbroker.protocol import codec

    return codec


def check(code: Any, what: str, message: str | None = None) -> None:
    """Raise Kafka's error for a non-zero error code."""
    if int(code) != 0:
        name = error_name(int(code))
        raise AdminError(f"{what}: {name}" + (f": {message}" if message else ""), EXIT_FAILED, error=name)


def api_name(api_key: int) -> str:
    """Kafka's name of an API (DescribeClientQuotas)."""
    name = _codec().API_NAMES.get(api_key)
    return "".join(w.capitalize() for w in str(name).split("_")) if name else f"Api{api_key}"


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.strip().rpartition(":")
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError as e:
        raise AdminError(f"a broker address is host:port, not {address!r}", 2) from e


def _ssl_context(props: Mapping[str, str]) -> ssl.SSLContext:
    """TLS as librdkafka reads its properties: the CA, the client's certificate and key, host name checks."""
    try:
        ctx = ssl.create_default_context(cafile=props.get("ssl.ca.location") or None)
        if props.get("ssl.certificate.location"):
            ctx.load_cert_chain(props["ssl.certificate.location"], props.get("ssl.key.location") or None,
                                props.get("ssl.key.password") or None)
    except (OSError, ssl.SSLError) as e:
        raise AdminError(f"cannot load the TLS files: {e}", 2) from e
    if props.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        ctx.check_hostname = False
    if props.get("enable.ssl.certificate.verification", "true").lower() == "false":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class Connection:
    """A connected, authenticated broker; ``request`` sends one API call and gives the decoded response."""

    def __init__(self, address: str, props: Mapping[str, str], timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._correlation = 0
        protocol = props.get("security.protocol", "PLAINTEXT").upper()
        if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise AdminError(f"security.protocol {protocol!r} is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, "
                             "SASL_SSL", 2)
        host, port = split_address(address)
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise AdminError(f"cannot connect to {address}: {e.strerror or e}", EXIT_UNREACHABLE,
                             error="NETWORK_EXCEPTION") from e
        try:
            sock.settimeout(timeout)
            if protocol in ("SSL", "SASL_SSL"):
                sock = _ssl_context(props).wrap_socket(sock, server_hostname=host)
        except (OSError, ssl.SSLError) as e:
            sock.close()
            raise AdminError(f"TLS with {address} failed: {e}", EXIT_UNREACHABLE, error="SSL_HANDSHAKE") from e
        self.sock: socket.socket = sock
        try:
            self.api_versions = self._negotiate()
            if protocol.startswith("SASL_"):
                self._authenticate(props)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.sock.close()

    # --- framing --------------------------------------------------------------------------------------

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        for _ in range(n + 1):  # each receive brings at least one byte
            if len(buf) >= n:
                break
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            buf += chunk
        return bytes(buf)

    def _round_trip(self, api_key: int, version: int, body: bytes, flexible_header: bool) -> tuple[bytes, int]:
        """Send one request; the response frame and where its header ends."""
        self._correlation += 1
        payload = encode_request_header(api_key, version, self._correlation, CLIENT_ID, flexible_header) + body
        what = f"{api_name(api_key)} to {self.address}"
        try:
            self.sock.sendall(encode_frame(payload))
            (size,) = struct.unpack(">i", self._recv_exact(4))
            if not 4 <= size <= _MAX_FRAME:
                raise ConnectionError(f"a response of {size} bytes")
            frame = self._recv_exact(size)
        except TimeoutError as e:
            raise AdminError(f"{what}: no answer within {self.timeout:g} s", EXIT_UNREACHABLE,
                             error="REQUEST_TIMED_OUT") from e
        except (OSError, ConnectionError) as e:
            raise AdminError(f"{what}: {e}", EXIT_UNREACHABLE, error="NETWORK_EXCEPTION") from e
        (answered,) = struct.unpack_from(">i", frame, 0)
        if answered != self._correlation:
            raise AdminError(f"{what}: answered correlation id {answered}, not {self._correlation}",
                             EXIT_UNREACHABLE, error="NETWORK_EXCEPTION")
        # Response header v1 (flexible versions, but never ApiVersions) adds tagged fields.
        offset = skip_tagged_fields(frame, 4) if flexible_header and api_key != API_VERSIONS else 4
        return frame, offset

    def _send(self, api_key: int, version: int, body: Mapping[str, Any]) -> Any:
        codec = _codec()
        flexible = codec.is_flexible(api_key, version)
        encoded = codec.encode_entity(codec.build(codec.request_class(api_key, version), body))
        frame, offset = self._round_trip(api_key, version, encoded, flexible)
        return codec.decode_response(api_key, version, frame, offset)

    # --- versions -------------------------------------------------------------------------------------

    def _negotiate(self) -> dict[int, tuple[int, int]]:
        """ApiVersions at the highest version we know. A broker that knows less answers UNSUPPORTED_VERSION in
        v0's layout, listing its own ApiVersions range, and is asked again at the version both know."""
        codec = _codec()
        version = codec.kio_versions(API_VERSIONS).stop - 1
        body = {"client_software_name": "pykbroker-admin", "client_software_version": __version__}
        for _ in range(2):
            encoded = codec.encode_entity(codec.build(codec.request_class(API_VERSIONS, version), body))
            frame, offset = self._round_trip(API_VERSIONS, version, encoded, codec.is_flexible(API_VERSIONS, version))
            (code,) = struct.unpack_from(">h", frame, offset) if len(frame) >= offset + 2 else (-1,)
            if code != UNSUPPORTED_VERSION or version == 0:
                response = codec.decode_response(API_VERSIONS, version, frame, offset)
                break
            theirs = codec.decode_response(API_VERSIONS, 0, frame, offset)
            offered = {int(k.api_key): int(k.max_version) for k in theirs.api_keys}
            version = min(version, offered.get(API_VERSIONS, 0))
        else:
            response = theirs
        self.api_versions_response = response
        check(response.error_code, f"ApiVersions to {self.address}")
        return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}

    def version(self, api_key: int, minimum: int = 0) -> int:
        """The highest version of ``api_key`` that both the broker and our codec know (at least ``minimum``)."""
        ours = _codec().kio_versions(api_key)
        theirs = self.api_versions.get(api_key)
        low = max(ours.start, minimum, theirs[0] if theirs else 0)
        high = min(ours.stop - 1, theirs[1] if theirs else -1)
        if theirs is None or high < low:
            offered = f"{theirs[0]}-{theirs[1]}" if theirs else "none"
            raise AdminError(f"{self.address} does not answer {api_name(api_key)} at a version this client knows "
                             f"(it offers {offered}, this client {low}-{ours.stop - 1})", EXIT_FAILED,
                             error="UNSUPPORTED_VERSION")
        return high

    def request(self, api_key: int, body: Mapping[str, Any], minimum: int = 0) -> tuple[int, Any]:
        """One request at the negotiated version: (the version, the decoded response)."""
        version = self.version(api_key, minimum)
        return version, self._send(api_key, version, body)

    # --- SASL -----------------------------------------------------------------------------------------

    def _authenticate(self, props: Mapping[str, str]) -> None:
        mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms", "GSSAPI")).upper()
        if mechanism not in MECHANISMS:
            raise AdminError(f"sasl.mechanism {mechanism} is not supported by this command's client; it supports "
                             f"{', '.join(MECHANISMS)}", 2, error="UNSUPPORTED_SASL_MECHANISM")
        user, password = props.get("sasl.username", ""), props.get("sasl.password", "")
        _, handshake = self.request(SASL_HANDSHAKE, {"mechanism": mechanism}, minimum=1)
        if int(handshake.error_code) != 0:
            name = error_name(int(handshake.error_code))
            raise AdminError(f"SASL handshake with {self.address}: {name} (the broker enables "
                             f"{', '.join(handshake.mechanisms) or 'none'})", EXIT_UNREACHABLE, error=name)
        if mechanism == "PLAIN":
            self._sasl_step(b"\x00" + user.encode() + b"\x00" + password.encode())
            return
        # The broker's own SCRAM client (sans-I/O; its inter-broker logins use it too).
        scram = ScramClient(mechanism, user, password)
        try:
            server_first = self._sasl_step(scram.first_message())
            scram.verify_server_final(self._sasl_step(scram.final_message(server_first)))
        except (SaslFailure, KeyError, ValueError) as e:
            raise AdminError(f"{mechanism} login to {self.address}: {e}", EXIT_UNREACHABLE,
                             error="SASL_AUTHENTICATION_FAILED") from e

    def _sasl_step(self, token: bytes) -> bytes:
        _, response = self.request(SASL_AUTHENTICATE, {"auth_bytes": token})
        if int(response.error_code) != 0:
            name = error_name(int(response.error_code))
            raise AdminError(f"authentication with {self.address} failed: {name}"
                             + (f": {response.error_message}" if response.error_message else ""),
                             EXIT_UNREACHABLE, error=name)
        return bytes(response.auth_bytes or b"")
