"""The per-connection SASL state machine (Kafka's SaslServerAuthenticator), sans-I/O.

The dispatcher asks it, for every frame of a SASL_* connection, whether the request may go on
(``check``), hands it SaslHandshake / SaslAuthenticate requests, and, after a SaslHandshake v0,
the raw size-prefixed tokens that follow without a Kafka header (``expects_raw_token``).

States: HANDSHAKE (ApiVersions and SaslHandshake only) -> AUTHENTICATE (SaslAuthenticate only;
RAW_TOKEN after a v0 handshake) -> COMPLETE (everything; a SaslHandshake starts a KIP-368
re-authentication) or FAILED (the next frame closes the connection).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from pykbroker.logsetup import fields
from pykbroker.protocol.responses.sasl import SaslAuthenticateResponse, SaslHandshakeResponse
from pykbroker.security.principal import KafkaPrincipal
from pykbroker.security.sasl.errors import SaslFailure
from pykbroker.security.sasl.oauthbearer import OAuthBearerServer
from pykbroker.security.sasl.plain import PlainServer
from pykbroker.security.sasl.scram import MECHANISMS as SCRAM_MECHANISMS
from pykbroker.security.sasl.scram import CredentialLookup, ScramServer

log = logging.getLogger("pykbroker.security.sasl")

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36


class SaslClose(Exception):
    """Kafka closes the connection here; the message is for the log line."""


class MechanismServer(Protocol):
    username: str
    complete: bool

    def evaluate(self, token: bytes) -> bytes: ...


@dataclass
class SaslServerSettings:
    """One listener's SASL settings, resolved from the broker config at start."""

    listener: str
    mechanisms: tuple[str, ...]
    plain_users: dict[str, str] = field(default_factory=dict, repr=False)
    max_reauth_ms: int = 0
    max_receive_size: int = 524288
    scram_lookup: CredentialLookup = lambda user, mechanism: None
    # OAuthBearerLoginModule options (unsecuredValidator*), when OAUTHBEARER is enabled.
    oauthbearer_options: dict[str, str] = field(default_factory=dict)

    def new_server(self, mechanism: str) -> MechanismServer:
        if mechanism == "PLAIN":
            return PlainServer(self.plain_users)
        if mechanism == "OAUTHBEARER":
            return OAuthBearerServer(self.oauthbearer_options)
        if mechanism in SCRAM_MECHANISMS:
            return ScramServer(mechanism, self.scram_lookup)
        raise ValueError(mechanism)


class State(Enum):
    HANDSHAKE = "handshake"
    AUTHENTICATE = "authenticate"
    RAW_TOKEN = "raw_token"
    COMPLETE = "complete"
    FAILED = "failed"


class SaslAuthenticator:
    """One connection's authentication; updates ``session.principal`` and ``session.reauth_deadline``."""

    def __init__(self, settings: SaslServerSettings, session: Any,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.session = session
        self._clock = clock
        self.state = State.HANDSHAKE
        self.mechanism = ""
        self._server: MechanismServer | None = None
        self._reauthenticating = False
        self._authenticate_version = -1  # SaslAuthenticate version of the last login (-1: v0 raw tokens)
        self._lifetime_ms = 0

    @property
    def expects_raw_token(self) -> bool:
        return self.state is State.RAW_TOKEN

    @property
    def authenticated(self) -> bool:
        return self.state is State.COMPLETE

    def check(self, api_key: int, api_name: str, frame_size: int) -> None:
        """May a request of this API go on now?  Raises SaslClose where Kafka closes the connection."""
        state = self.state
        if state is State.COMPLETE:
            deadline = self.session.reauth_deadline
            if deadline is not None and api_key != SASL_HANDSHAKE and self._clock() >= deadline:
                raise SaslClose(f"SASL session of {self.session.principal} expired "
                                f"(connections.max.reauth.ms={self.settings.max_reauth_ms}) and the client sent "
                                f"{api_name} instead of re-authenticating")
            return
        if frame_size > self.settings.max_receive_size:
            raise SaslClose(f"SASL request of {frame_size} bytes is larger than sasl.server.max.receive.size="
                            f"{self.settings.max_receive_size}")
        if state is State.FAILED:
            raise SaslClose(f"{api_name} request after a failed SASL authentication")
        if state is State.HANDSHAKE:
            if api_key in (API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE):
                return
            raise SaslClose(f"Unexpected Kafka request of type {api_name} during SASL handshake")
        if state is State.AUTHENTICATE:
            if api_key in (SASL_AUTHENTICATE, SASL_HANDSHAKE):
                return
            raise SaslClose(f"Unexpected Kafka request of type {api_name} during SASL authentication")

    # --- SaslHandshake ------------------------------------------------------------------------

    def handshake(self, version: int, mechanism: str) -> SaslHandshakeResponse:
        enabled = list(self.settings.mechanisms)
        if self.state is State.COMPLETE:
            if version < 1 or self._authenticate_version < 1:
                # No KIP-368 re-authentication without SaslAuthenticate v1+: Kafka's KafkaApis answers
                # ILLEGAL_SASL_STATE and the session goes on.
                return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": enabled}
            self._reauthenticating = True
        elif self.state is not State.HANDSHAKE:
            self.state = State.FAILED
            log.warning("SASL handshake out of order",
                        extra=fields(peer=self.session.peer, listener=self.settings.listener))
            return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": enabled}
        if mechanism not in enabled:
            self.state = State.FAILED
            log.warning("failed authentication: unsupported SASL mechanism",
                        extra=fields(peer=self.session.peer, listener=self.settings.listener,
                                     mechanism=mechanism[:64], enabled=",".join(enabled)))
            return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": enabled}
        if self._reauthenticating and mechanism != self.mechanism:
            self.state = State.FAILED
            log.warning("failed re-authentication: the mechanism differs from the first authentication's",
                        extra=fields(peer=self.session.peer, listener=self.settings.listener,
                                     mechanism=mechanism, first_mechanism=self.mechanism))
            return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": enabled}
        self.mechanism = mechanism
        self._server = self.settings.new_server(mechanism)
        self.state = State.RAW_TOKEN if version == 0 else State.AUTHENTICATE
        return {"error_code": ErrorCode.none, "mechanisms": enabled}

    # --- SaslAuthenticate and raw tokens ------------------------------------------------------

    def authenticate(self, version: int, token: bytes) -> SaslAuthenticateResponse:
        body: SaslAuthenticateResponse = {"error_code": ErrorCode.none, "error_message": None, "auth_bytes": b"",
                                          "session_lifetime": 0}
        if self.state is State.COMPLETE:  # as Kafka's KafkaApis: an error, the session goes on
            body.update({"error_code": ErrorCode.illegal_sasl_state,
                         "error_message": "SaslAuthenticate request received after successful authentication"})
            return body
        if self.state is not State.AUTHENTICATE:
            self.state = State.FAILED
            log.warning("SaslAuthenticate out of order",
                        extra=fields(peer=self.session.peer, listener=self.settings.listener))
            body.update({"error_code": ErrorCode.illegal_sasl_state,
                         "error_message": "Unexpected SaslAuthenticate request: no SASL handshake in progress"})
            return body
        try:
            body["auth_bytes"] = self._evaluate(token)
        except SaslFailure as e:
            body.update({"error_code": ErrorCode.sasl_authentication_failed, "error_message": e.message})
            return body
        if self.state is State.COMPLETE:
            self._authenticate_version = version
            if version >= 1:
                body["session_lifetime"] = self._session_lifetime_ms()
        return body

    def raw_token(self, token: bytes) -> bytes:
        """A token after SaslHandshake v0; returns the raw response token (without the size)."""
        if len(token) > self.settings.max_receive_size:
            self.state = State.FAILED
            raise SaslClose(f"SASL token of {len(token)} bytes is larger than sasl.server.max.receive.size="
                            f"{self.settings.max_receive_size}")
        try:
            response = self._evaluate(token)
        except SaslFailure as e:
            raise SaslClose(f"SASL authentication failed: {e.message}") from None
        if self.state is State.COMPLETE:
            self._authenticate_version = -1
        else:
            self.state = State.RAW_TOKEN
        return response

    def _evaluate(self, token: bytes) -> bytes:
        server = self._server
        assert server is not None
        peer, listener = self.session.peer, self.settings.listener
        try:
            response = server.evaluate(token)
        except SaslFailure as e:
            self.state = State.FAILED
            log.warning("failed authentication", extra=fields(
                peer=peer, listener=listener, mechanism=self.mechanism, user=(e.username or server.username)[:256],
                reason=e.detail))
            raise
        if not server.complete:
            return response
        principal = KafkaPrincipal("User", server.username)
        if self._reauthenticating and principal != self.session.principal:
            self.state = State.FAILED
            log.warning("failed re-authentication: the principal differs from the first authentication's",
                        extra=fields(peer=peer, listener=listener, mechanism=self.mechanism,
                                     principal=str(principal), first_principal=str(self.session.principal)))
            raise SaslFailure(f"Cannot change principals during re-authentication from "
                              f"{self.session.principal}: {principal}")
        self.session.principal = principal
        self.state = State.COMPLETE
        self._server = None
        lifetime = self.settings.max_reauth_ms
        credential_ms = getattr(server, "lifetime_ms", None)  # an OAUTHBEARER token's remaining life
        if lifetime > 0 and credential_ms is not None:
            lifetime = max(min(lifetime, credential_ms), 1)
        self._lifetime_ms = lifetime
        self.session.reauth_deadline = self._clock() + lifetime / 1000 if lifetime > 0 else None
        log.info("re-authenticated" if self._reauthenticating else "authenticated",
                 extra=fields(peer=peer, listener=listener, mechanism=self.mechanism, principal=str(principal)))
        self._reauthenticating = False
        return response

    def _session_lifetime_ms(self) -> int:
        return max(self._lifetime_ms, 0)
