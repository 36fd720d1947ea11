"""Response bodies of SaslHandshake, SaslAuthenticate, DescribeUserScramCredentials, AlterUserScramCredentials: kio's
field names, over every version pykbroker answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypedDict


class SaslHandshakeResponse(TypedDict):
    """SaslHandshakeResponse (API key 17), versions 0-1."""

    error_code: int
    mechanisms: NotRequired[Sequence[str]]


class SaslAuthenticateResponse(TypedDict):
    """SaslAuthenticateResponse (API key 36), versions 0-2."""

    error_code: int
    error_message: str | None
    auth_bytes: bytes
    session_lifetime: NotRequired[int]


class DescribeUserScramCredentialsResponse(TypedDict):
    """DescribeUserScramCredentialsResponse (API key 50), versions 0-0."""

    throttle_time: int
    error_code: int
    error_message: str | None
    results: Sequence[DescribeUserScramCredentialsResult]


class DescribeUserScramCredentialsResult(TypedDict):
    user: str
    error_code: int
    error_message: str | None
    credential_infos: Sequence[CredentialInfo]


class CredentialInfo(TypedDict):
    mechanism: int
    iterations: int


class AlterUserScramCredentialsResponse(TypedDict):
    """AlterUserScramCredentialsResponse (API key 51), versions 0-0."""

    throttle_time: int
    results: Sequence[AlterUserScramCredentialsResult]


class AlterUserScramCredentialsResult(TypedDict):
    user: str
    error_code: int
    error_message: str | None
