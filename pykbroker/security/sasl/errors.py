"""The exception a mechanism raises when a login fails."""

from __future__ import annotations


class SaslFailure(Exception):
    """A failed login: ``message`` goes to the client in SaslAuthenticate's error_message.

    ``detail`` is for the broker's log only (never a password or secret).
    """

    def __init__(self, message: str, detail: str = "", username: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or message
        self.username = username
