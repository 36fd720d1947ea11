"""A connection's security state: its listener, protocol, peer and authenticated principal.

The network edge makes one per accepted connection; TLS sets the principal from the client
certificate (mTLS), the SASL authenticator from the login; every request's context reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pykbroker.security.principal import ANONYMOUS, KafkaPrincipal


@dataclass(slots=True)
class Session:
    listener: str = "PLAINTEXT"
    security_protocol: str = "PLAINTEXT"
    peer: str = ""  # "host:port" of the client
    principal: KafkaPrincipal = ANONYMOUS
    # The SASL authenticator of a SASL_PLAINTEXT / SASL_SSL connection (pykbroker.security.sasl); None otherwise.
    authenticator: Any = None
    # anyio clock time after which the connection must re-authenticate (KIP-368), or None.
    reauth_deadline: float | None = None
    # anyio clock time until which a throttled client's next request is not read (client quotas, KIP-219).
    muted_until: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def client_host(self) -> str:
        """The client's address without the port, as ACL host matching uses it."""
        host = self.peer.rsplit(":", 1)[0] if ":" in self.peer else self.peer
        return host.strip("[]")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")
