"""An async connection to another broker: Kafka request/response framing over anyio TCP.

One request at a time per connection (the replica fetcher's pattern), a correlation id
per request checked on the response, and a time limit per request
(``replica.socket.timeout.ms``); any failure closes the connection and the caller reconnects
after ``replica.fetch.backoff.ms``.
"""

from __future__ import annotations

import ssl
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar

import anyio
import anyio.abc

from pykbroker.protocol import codec
from pykbroker.protocol.framing import BrokerConnectionError
from pykbroker.protocol.header import skip_tagged_fields

_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhih")
MAX_RESPONSE_BYTES = 1 << 30
# Take whatever the transport has read in one piece: anyio's default receive (64 KiB) splits the
# transport's 256 KiB reads and re-queues the rest, copying it again each time, and costs a
# pause/resume of reading (two epoll changes) per call -- per MiB of a replica fetch, several.
RECEIVE_MAX = 1 << 24


OnConnect = Callable[["BrokerClient"], Awaitable[None]]


class BrokerClient:
    """Requests to one broker endpoint; flexible API versions (request header v2), and v1 headers for
    the few APIs without one (SaslHandshake)."""

    # Run on every new connection before its first request (the inter-broker SASL login); the broker
    # sets it once at start for all its inter-broker connections (one identity per broker process).
    default_on_connect: ClassVar[OnConnect | None] = None
    # TLS client context of the inter-broker listener (SSL / SASL_SSL), set by the broker at start
    # (pykbroker.security.tls.client_context); None: plaintext.
    default_ssl_context: ClassVar[ssl.SSLContext | None] = None

    def __init__(self, host: str, port: int, *, client_id: str, timeout_s: float,
                 on_connect: OnConnect | None = None) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id.encode()
        self.timeout_s = timeout_s
        self.on_connect = on_connect if on_connect is not None else BrokerClient.default_on_connect
        self.ssl_context = BrokerClient.default_ssl_context
        self._stream: anyio.abc.ByteStream | None = None
        self._buf = bytearray()
        self._correlation_id = 0

    @property
    def connected(self) -> bool:
        return self._stream is not None

    async def connect(self) -> None:
        try:
            with anyio.fail_after(self.timeout_s):
                if self.ssl_context is not None:
                    self._stream = await anyio.connect_tcp(self.host, self.port, ssl_context=self.ssl_context,
                                                           tls_standard_compatible=False)
                else:
                    self._stream = await anyio.connect_tcp(self.host, self.port)
        except (OSError, TimeoutError, ssl.SSLError, anyio.BrokenResourceError) as exc:
            raise BrokerConnectionError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        self._buf.clear()
        if self.on_connect is not None:
            try:
                with anyio.fail_after(self.timeout_s):
                    await self.on_connect(self)
            except TimeoutError as exc:
                await self.close()
                raise BrokerConnectionError(f"login to {self.host}:{self.port} timed out") from exc
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    def encode_request(self, api_key: int, version: int, body: Mapping[str, Any]) -> tuple[int, bytes]:
        """(correlation id, framed request bytes)."""
        # Request header v2 (flexible versions) or v1 (SaslHandshake, which has no flexible version).
        tagged = b"\x00" if codec.is_flexible(api_key, version) else b""
        self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        cid = self._correlation_id
        header = _HEADER.pack(api_key, version, cid, len(self.client_id)) + self.client_id + tagged
        payload = header + codec.encode_entity(codec.build(codec.request_class(api_key, version), body))
        return cid, _SIZE.pack(len(payload)) + payload

    async def request(self, api_key: int, version: int, body: Mapping[str, Any],
                      timeout_s: float | None = None) -> Any:
        """Send one request and decode its response; raises BrokerConnectionError (connection closed)."""
        if self._stream is None:
            await self.connect()
        assert self._stream is not None
        cid, frame = self.encode_request(api_key, version, body)
        try:
            with anyio.fail_after(timeout_s if timeout_s is not None else self.timeout_s):
                await self._stream.send(frame)
                payload = await self._read_frame()
        except (OSError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError,
                anyio.ClosedResourceError) as exc:
            await self.close()
            raise BrokerConnectionError(f"request to {self.host}:{self.port} failed: {exc!r}") from exc
        got = _SIZE.unpack_from(payload, 0)[0]
        if got != cid:
            await self.close()
            raise BrokerConnectionError(f"correlation id {got} does not match the request's {cid}")
        try:
            # response header v1 (flexible) or v0
            offset = skip_tagged_fields(payload, 4) if codec.is_flexible(api_key, version) else 4
            return codec.decode_response(api_key, version, payload, offset)
        except Exception as exc:
            await self.close()
            raise BrokerConnectionError(f"undecodable response from {self.host}:{self.port}: {exc}") from exc

    async def _read_frame(self) -> bytes:
        """The next response's payload; what was read past it stays buffered."""
        assert self._stream is not None
        while len(self._buf) < 4:
            self._buf += await self._stream.receive(RECEIVE_MAX)
        size = _SIZE.unpack_from(self._buf, 0)[0]
        if size < 4 or size > MAX_RESPONSE_BYTES:
            raise OSError(f"bad response size {size}")
        while len(self._buf) < 4 + size:
            self._buf += await self._stream.receive(RECEIVE_MAX)
        with memoryview(self._buf) as view:  # one copy out (a bytearray slice would be a second)
            frame = bytes(view[4 : 4 + size])
        del self._buf[: 4 + size]
        return frame
