"""SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677): credentials and the server side.

Only the salted keys are kept (salt, StoredKey, ServerKey, iterations), never a password.
Channel binding is not supported: the client must send the gs2 header "n,," (or "y,,").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from pykbroker.security.sasl.errors import SaslFailure

# Kafka's ScramMechanism: name -> (hash, minimum iterations); the int8 code of the admin APIs.
MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISM_CODES = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MECHANISM_BY_CODE = {v: k for k, v in MECHANISM_CODES.items()}
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384  # Kafka's limit for AlterUserScramCredentials


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode(), validate=True)


def hi(hash_name: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    """RFC 5802 Hi(): PBKDF2 with HMAC."""
    return hashlib.pbkdf2_hmac(hash_name, password, salt, iterations)


def _hmac(hash_name: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hash_name).digest()


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def from_salted_password(cls, mechanism: str, salt: bytes, salted_password: bytes,
                             iterations: int) -> ScramCredential:
        h = MECHANISMS[mechanism]
        client_key = _hmac(h, salted_password, b"Client Key")
        return cls(salt, hashlib.new(h, client_key).digest(), _hmac(h, salted_password, b"Server Key"), iterations)

    @classmethod
    def from_password(cls, mechanism: str, password: str, iterations: int = MIN_ITERATIONS,
                      salt: bytes | None = None) -> ScramCredential:
        salt = salt if salt is not None else secrets.token_bytes(32)
        salted = hi(MECHANISMS[mechanism], password.encode(), salt, iterations)
        return cls.from_salted_password(mechanism, salt, salted, iterations)

    def to_kafka_string(self) -> str:
        """Kafka's stored form (ZooKeeper /config/users/<user>): salt=..,stored_key=..,server_key=..,iterations=n."""
        return (f"salt={_b64(self.salt)},stored_key={_b64(self.stored_key)},"
                f"server_key={_b64(self.server_key)},iterations={self.iterations}")

    @classmethod
    def from_kafka_string(cls, text: str) -> ScramCredential:
        fields = dict(p.split("=", 1) for p in text.split(",") if "=" in p)
        try:
            return cls(_unb64(fields["salt"]), _unb64(fields["stored_key"]), _unb64(fields["server_key"]),
                       int(fields["iterations"]))
        except (KeyError, ValueError) as e:
            raise ValueError(f"invalid SCRAM credential: {type(e).__name__}") from None


def _decode_saslname(name: str) -> str:
    if re.search(r"=(?!2C|3D)", name):
        raise ValueError("invalid saslname encoding")
    return name.replace("=2C", ",").replace("=3D", "=")


def encode_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


_CLIENT_FIRST = re.compile(
    r"^(?P<gs2>[ny],(?:a=(?P<authzid>[^,]*))?,)n=(?P<user>[^,]+),r=(?P<nonce>[\x21-\x2b\x2d-\x7e]+)"
    r"(?P<ext>(?:,[a-zA-Z][^,]*)*)$")
_CLIENT_FINAL = re.compile(r"^c=(?P<cbind>[^,]*),r=(?P<nonce>[^,]*)(?:,[a-zA-Z]=[^,]*)*?,p=(?P<proof>[^,]+)$")

CredentialLookup = Callable[[str, str], "ScramCredential | None"]


def invalid_credentials(mechanism: str) -> str:
    """Kafka's message for a SCRAM login that failed (any reason, so nothing leaks about users)."""
    return f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"


class ScramServer:
    """One SCRAM exchange: client-first -> server-first, client-final -> server-final."""

    def __init__(self, mechanism: str, lookup: CredentialLookup, nonce: str | None = None) -> None:
        self.mechanism = mechanism
        self._hash = MECHANISMS[mechanism]
        self._lookup = lookup
        self._server_nonce = nonce if nonce is not None else secrets.token_urlsafe(24)
        self._state = "first"
        self.username = ""
        self.complete = False
        self._credential: ScramCredential | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2 = ""
        self._nonce = ""

    def _fail(self, detail: str) -> SaslFailure:
        self._state = "failed"
        return SaslFailure(invalid_credentials(self.mechanism), detail, self.username)

    def evaluate(self, token: bytes) -> bytes:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail("SCRAM message is not UTF-8") from None
        if self._state == "first":
            return self._client_first(text)
        if self._state == "final":
            return self._client_final(text)
        raise self._fail("unexpected SCRAM message after the exchange ended")

    def _client_first(self, text: str) -> bytes:
        m = _CLIENT_FIRST.match(text)
        if m is None:
            raise self._fail("invalid SCRAM client-first message")
        try:
            self.username = _decode_saslname(m["user"])
        except ValueError:
            raise self._fail("invalid SCRAM user name encoding") from None
        if m["authzid"] and m["authzid"] != self.username:
            raise self._fail("client requested an authorization id different from the user name")
        extensions = dict(e.split("=", 1) for e in m["ext"].split(",")[1:] if "=" in e)
        if extensions.get("tokenauth", "false").lower() == "true":
            raise self._fail("delegation tokens are not supported")
        self._credential = self._lookup(self.username, self.mechanism)
        if self._credential is None:
            raise self._fail("unknown user")
        if self._credential.iterations < MIN_ITERATIONS:
            raise self._fail(f"stored credential has fewer than {MIN_ITERATIONS} iterations")
        self._gs2 = m["gs2"]
        self._client_first_bare = text[len(self._gs2):]
        self._nonce = m["nonce"] + self._server_nonce
        self._server_first = (f"r={self._nonce},s={_b64(self._credential.salt)},"
                              f"i={self._credential.iterations}")
        self._state = "final"
        return self._server_first.encode()

    def _client_final(self, text: str) -> bytes:
        m = _CLIENT_FINAL.match(text)
        if m is None:
            raise self._fail("invalid SCRAM client-final message")
        # Kafka 3.x's ScramSaslServer checks that the nonce ends with the server-first one (librdkafka before
        # 2.6.1 repeats the client nonce in front; Kafka 4 wants an exact match and refuses those clients);
        # the proof covers the nonce as sent either way.
        if not m["nonce"].endswith(self._nonce):
            raise self._fail("SCRAM nonce mismatch")
        try:
            cbind = _unb64(m["cbind"])
            proof = _unb64(m["proof"])
        except ValueError:
            raise self._fail("invalid base64 in SCRAM client-final message") from None
        if cbind != self._gs2.encode():
            raise self._fail("channel binding is not supported")
        cred = self._credential
        assert cred is not None
        without_proof = text[: text.rindex(",p=")]
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_signature = _hmac(self._hash, cred.stored_key, auth_message)
        if len(proof) != len(client_signature):
            raise self._fail("invalid client proof")
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), cred.stored_key):
            raise self._fail("invalid client proof")
        self._state = "done"
        self.complete = True
        return f"v={_b64(_hmac(self._hash, cred.server_key, auth_message))}".encode()


class ScramClient:
    """The client side (inter-broker connections and tests)."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None) -> None:
        self._hash = MECHANISMS[mechanism]
        self._password = password.encode()
        self._nonce = nonce if nonce is not None else secrets.token_urlsafe(24)
        self._bare = f"n={encode_saslname(username)},r={self._nonce}"
        self._server_signature = b""

    def first_message(self) -> bytes:
        return f"n,,{self._bare}".encode()

    def final_message(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        fields = dict(p.split("=", 1) for p in text.split(",") if "=" in p)
        if "e" in fields:
            raise SaslFailure(f"server error: {fields['e']}")
        nonce, salt, iterations = fields["r"], _unb64(fields["s"]), int(fields["i"])
        if not nonce.startswith(self._nonce) or iterations < MIN_ITERATIONS:
            raise SaslFailure("invalid SCRAM server-first message")
        salted = hi(self._hash, self._password, salt, iterations)
        client_key = _hmac(self._hash, salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c={_b64(b'n,,')},r={nonce}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        signature = _hmac(self._hash, stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = _hmac(self._hash, _hmac(self._hash, salted, b"Server Key"), auth_message)
        return f"{without_proof},p={_b64(proof)}".encode()

    def verify_server_final(self, server_final: bytes) -> None:
        text = server_final.decode()
        if text.startswith("e="):
            raise SaslFailure(f"server error: {text[2:]}")
        if not text.startswith("v=") or not hmac.compare_digest(_unb64(text[2:]), self._server_signature):
            raise SaslFailure("invalid SCRAM server signature")
