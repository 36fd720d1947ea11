"""The client side of SASL for the broker's own connections to other brokers.

``authenticate(client, credentials)`` runs SaslHandshake v1 then SaslAuthenticate v2 on a freshly
connected ``BrokerClient`` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), with the username/password of the
inter-broker listener's JAAS config.  A failure raises ``SaslClientError`` (the caller closes the
connection and retries after its backoff).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.protocol.framing import BrokerConnectionError
from pykbroker.security.sasl.errors import SaslFailure
from pykbroker.security.sasl.scram import MECHANISMS as SCRAM_MECHANISMS
from pykbroker.security.sasl.scram import ScramClient
from pykbroker.security.sasl.settings import ClientCredentials

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36


class SaslClientError(BrokerConnectionError):
    """The broker refused our login; callers treat it as a failed connection (close, back off, retry)."""


def plain_token(username: str, password: str) -> bytes:
    return f"\x00{username}\x00{password}".encode()


async def _step(client: Any, token: bytes) -> bytes:
    resp = await client.request(SASL_AUTHENTICATE, 2, {"auth_bytes": token})
    if resp.error_code != ErrorCode.none:
        raise SaslClientError(f"SASL authentication to {client.host}:{client.port} failed: "
                              f"{resp.error_code.name}: {resp.error_message}")
    return bytes(resp.auth_bytes)


async def authenticate(client: Any, creds: ClientCredentials) -> None:
    """Log ``client`` (a connected BrokerClient) in with ``creds``."""
    resp = await client.request(SASL_HANDSHAKE, 1, {"mechanism": creds.mechanism})
    if resp.error_code != ErrorCode.none:
        raise SaslClientError(f"SASL handshake with {client.host}:{client.port} for {creds.mechanism} failed: "
                              f"{resp.error_code.name} (broker enables {', '.join(resp.mechanisms)})")
    if creds.mechanism == "PLAIN":
        await _step(client, plain_token(creds.username, creds.password))
        return
    if creds.mechanism not in SCRAM_MECHANISMS:
        raise SaslClientError(f"SASL mechanism {creds.mechanism} is not implemented")
    scram = ScramClient(creds.mechanism, creds.username, creds.password)
    server_first = await _step(client, scram.first_message())
    try:
        server_final = await _step(client, scram.final_message(server_first))
        scram.verify_server_final(server_final)
    except SaslFailure as e:
        raise SaslClientError(f"SCRAM login to {client.host}:{client.port}: {e.message}") from None


def on_connect_hook(creds: ClientCredentials | None) -> Any:
    """An ``on_connect(client)`` hook for BrokerClient, or None when no SASL is needed."""
    if creds is None:
        return None

    async def on_connect(client: Any) -> None:
        await authenticate(client, creds)

    return on_connect
