"""What a request carries besides its body: its header, the listener and peer it came from, the
connection's security session and the broker's authorizer.  Handlers on every floor above (the
coordinators' request handlers, delayed delivery, the server's API handlers) take it as an argument."""

from __future__ import annotations

from dataclasses import dataclass, field

from pykbroker.protocol import codec
from pykbroker.protocol.header import RequestHeader
from pykbroker.security.authorizer import Authorizer
from pykbroker.security.session import Session


@dataclass
class RequestContext:
    header: RequestHeader
    listener: str = "PLAINTEXT"
    peer: str = ""
    # The connection's security state (principal, protocol); a PLAINTEXT anonymous one by default.
    session: Session = field(default_factory=Session)
    # The broker's authorizer (None: allow everything, as Kafka without authorizer.class.name).
    authorizer: Authorizer | None = None

    @property
    def version(self) -> int:
        return self.header.api_version

    @property
    def api_name(self) -> str:
        return codec.API_NAMES.get(self.header.api_key, str(self.header.api_key)).upper()
