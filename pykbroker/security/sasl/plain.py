"""SASL/PLAIN (RFC 4616) server side, with Kafka's PlainSaslServer messages."""

from __future__ import annotations

import hmac

from pykbroker.security.sasl.errors import SaslFailure

INVALID = "Authentication failed: Invalid username or password"


class PlainServer:
    mechanism = "PLAIN"

    def __init__(self, users: dict[str, str]) -> None:
        self._users = users
        self.username = ""
        self.complete = False

    def evaluate(self, token: bytes) -> bytes:
        parts = token.decode("utf-8", errors="replace").split("\x00")
        if len(parts) != 3:
            raise SaslFailure(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}")
        authzid, username, password = parts
        self.username = username
        if not username:
            raise SaslFailure("Authentication failed: username not specified")
        if not password:
            raise SaslFailure("Authentication failed: password not specified", username=username)
        expected = self._users.get(username)
        # Compare even for an unknown user, so timing does not tell which users exist.
        ok = hmac.compare_digest((expected or "\x00").encode(), password.encode()) and expected is not None
        if not ok:
            raise SaslFailure(INVALID, "invalid username or password", username)
        if authzid and authzid != username:
            raise SaslFailure("Authentication failed: Client requested an authorization id that is different "
                              "from username", username=username)
        self.complete = True
        return b""
