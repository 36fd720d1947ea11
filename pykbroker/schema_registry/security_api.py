"""What the HTTP layer asks of the registry's security (implemented in security.py): who is calling, whether
they may do what they ask, and the TLS context of an https listener. A Protocol, so that the app depends on
the decision only, not on how users and ACLs are stored."""

from __future__ import annotations

import ssl
from typing import Any, Protocol

OPERATIONS = ("READ", "WRITE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS")


class Unauthorized(Exception):
    """The credentials are missing or wrong: HTTP 401 with ``WWW-Authenticate: Basic``."""


class RegistrySecurity(Protocol):
    async def authenticate(self, authorization: str | None) -> str | None:
        """The principal (``User:alice``) of the request's Authorization header, None (anonymous) when
        authentication is off; raises Unauthorized."""
        ...

    def authorize(self, principal: str | None, host: str, operation: str, subject: str | None) -> bool:
        """Whether ``principal`` from ``host`` may do ``operation`` (one of OPERATIONS) on ``subject`` (None:
        the global config or mode, or a request naming no subject)."""
        ...

    def ssl_context(self, config: Any) -> ssl.SSLContext | None:
        """The server TLS context of an https registry listener (None when the listener is http)."""
        ...
