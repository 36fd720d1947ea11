"""SASL/OAUTHBEARER (RFC 7628) with unsecured JWS tokens: Kafka's default server validator
(OAuthBearerUnsecuredValidatorCallbackHandler) when no callback handler class is configured.

A token is accepted when its header says ``"alg": "none"``, it has no signature, its principal
claim (``sub`` unless ``unsecuredValidatorPrincipalClaimName`` says otherwise) is a non-empty
string, ``exp`` is in the future (within ``unsecuredValidatorAllowableClockSkewMs``), and it holds
every scope of ``unsecuredValidatorRequiredScope``.  Such tokens prove nothing: Kafka documents
them for development only, and so does pykbroker.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable
from typing import Any

from pykbroker.security.sasl.errors import SaslFailure

_CLIENT_FIRST = re.compile(r"^n,(?:a=(?P<authzid>[^,]*))?,\x01(?P<kv>(?:[A-Za-z]+=[\x21-\x7e \t]*\x01)*)\x01$", re.S)
_ERROR_JSON = json.dumps({"status": "invalid_token"}).encode()
_TOKEN = re.compile(r"^[Bb]earer +(?P<token>[A-Za-z0-9._~+/=-]+)$")


def _b64url_json(part: str) -> dict[str, Any]:
    data = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


class OAuthBearerServer:
    mechanism = "OAUTHBEARER"

    def __init__(self, options: dict[str, str], clock: Callable[[], float] = time.time) -> None:
        self._principal_claim = options.get("unsecuredValidatorPrincipalClaimName", "sub")
        self._scope_claim = options.get("unsecuredValidatorScopeClaimName", "scope")
        self._required = (options.get("unsecuredValidatorRequiredScope") or "").replace(",", " ").split()
        self._skew_s = int(options.get("unsecuredValidatorAllowableClockSkewMs", "0") or 0) / 1000
        self._clock = clock
        self.username = ""
        self.complete = False
        self.lifetime_ms: int | None = None  # until the token expires
        self._error: str | None = None  # the problem with the token, for the log

    def evaluate(self, token: bytes) -> bytes:
        if self._error is not None:  # the client's %x01 after our error challenge; Kafka's message is the JSON
            raise SaslFailure(_ERROR_JSON.decode(), self._error, self.username)
        m = _CLIENT_FIRST.match(token.decode("utf-8", errors="replace"))
        if m is None:
            raise SaslFailure("Authentication failed: invalid OAUTHBEARER client first message",
                              "invalid OAUTHBEARER client first message")
        kv = dict(p.split("=", 1) for p in m["kv"].split("\x01") if p)
        auth = _TOKEN.match(kv.get("auth", ""))
        if auth is None:
            raise SaslFailure("Authentication failed: invalid OAUTHBEARER auth value", "invalid auth value")
        problem = self._validate(auth["token"])
        if problem is None and m["authzid"] and m["authzid"] != self.username:
            problem = "authorization id differs from the token's principal"
        if problem is not None:
            # RFC 7628: an error challenge; the client answers %x01 and the exchange fails.
            self._error = problem
            return _ERROR_JSON
        self.complete = True
        return b""

    def _validate(self, token: str) -> str | None:
        parts = token.split(".")
        if len(parts) != 3 or parts[2]:
            return "the token is not an unsecured JWS (header.payload. with an empty signature)"
        try:
            header, claims = _b64url_json(parts[0]), _b64url_json(parts[1])
        except (ValueError, UnicodeDecodeError):
            return "the token's header or claims are not base64url JSON"
        if header.get("alg") != "none":
            return "the token's alg is not none"
        principal = claims.get(self._principal_claim)
        if not isinstance(principal, str) or not principal.strip():
            return f"the token has no {self._principal_claim} claim"
        self.username = principal
        now = self._clock()
        exp = claims.get("exp")
        if not isinstance(exp, int | float) or isinstance(exp, bool):
            return "the token has no numeric exp claim"
        if now - self._skew_s >= exp:
            return "the token has expired"
        iat = claims.get("iat")
        if iat is not None and (not isinstance(iat, int | float) or iat > now + self._skew_s):
            return "the token's iat claim is in the future or not a number"
        scope = claims.get(self._scope_claim, [])
        scopes = scope.split() if isinstance(scope, str) else [s for s in scope if isinstance(s, str)] \
            if isinstance(scope, list) else []
        missing = [s for s in self._required if s not in scopes]
        if missing:
            return f"the token lacks the required scope(s) {' '.join(missing)}"
        self.lifetime_ms = max(int((exp - now) * 1000), 0)
        return None


def unsecured_token(principal: str, lifetime_s: float = 3600, now: float | None = None, **claims: Any) -> str:
    """An unsecured JWS (tests, and what librdkafka's enable.sasl.oauthbearer.unsecure.jwt makes)."""
    def enc(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    issued = time.time() if now is None else now
    return f"{enc({'alg': 'none'})}.{enc({'sub': principal, 'iat': issued, 'exp': issued + lifetime_s, **claims})}."
