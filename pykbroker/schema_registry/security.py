"""Schema registry security: HTTP basic authentication against the brokers' SCRAM users, the rule that
protects a subject with the ACLs of its topic, and the TLS context of an https registry listener.

The registry has no users or ACLs of its own: an operator manages one set of users (``pykbroker scram``,
AlterUserScramCredentials) and one set of ACLs (``kafka-acls``, ``pykbroker acl``) for Kafka clients and
registry clients alike (docs/schema-registry.md, "Security").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import anyio
import anyio.to_thread

from pykbroker.config.parsing import SCHEMA_REGISTRY_LISTENER
from pykbroker.logsetup import fields
from pykbroker.schema_registry.security_api import OPERATIONS, Unauthorized
from pykbroker.security.authorizer import ANONYMOUS, AclOperation, Authorizer, ResourceType
from pykbroker.security.authz import CLUSTER_NAME
from pykbroker.security.principal import USER_TYPE, KafkaPrincipal
from pykbroker.security.sasl.scram import MECHANISMS, MIN_ITERATIONS, ScramCredential, hi
from pykbroker.security.tls import client_context, server_tls

log = logging.getLogger("pykbroker.schema_registry.security")
authz_log = logging.getLogger("pykbroker.authorizer")

AUTHENTICATION = "pykbroker.schema.registry.authentication"
REALM = "pykbroker"
WWW_AUTHENTICATE = f'Basic realm="{REALM}"'
# listener.name.schema_registry.ssl.* overrides the broker's ssl.* for the https registry listener.
LISTENER_NAME = SCHEMA_REGISTRY_LISTENER

# A user's SCRAM credentials by mechanism, as the metadata store holds them (MetadataStore.scram_credentials).
CredentialLookup = Callable[[str], Mapping[str, ScramCredential]]

_O = AclOperation
# A subject's operation -> the operation checked on its topic. READ is DESCRIBE so that whoever may read or
# write a topic (both imply DESCRIBE in Kafka) may read its schemas: producers look schemas up, consumers
# fetch them by id.
SUBJECT_OPERATIONS: dict[str, AclOperation] = {
    "READ": _O.DESCRIBE, "WRITE": _O.WRITE, "DELETE": _O.DELETE,
    "DESCRIBE_CONFIGS": _O.DESCRIBE_CONFIGS, "ALTER_CONFIGS": _O.ALTER_CONFIGS,
}
# An operation without a subject (the global compatibility level and mode) -> the operation on the cluster.
# READ without a subject (the root, /schemas/types, /contexts; the lists of subjects and schemas, which show
# only what the principal may READ) is allowed to every authenticated principal: None here.
GLOBAL_OPERATIONS: dict[str, AclOperation | None] = {
    "READ": None, "WRITE": _O.ALTER, "DELETE": _O.ALTER,
    "DESCRIBE_CONFIGS": _O.DESCRIBE_CONFIGS, "ALTER_CONFIGS": _O.ALTER_CONFIGS,
}
_SUBJECT_SUFFIXES = ("-key", "-value")  # TopicNameStrategy: <topic>-key, <topic>-value


def subject_topic(subject: str) -> str:
    """The topic whose ACLs protect ``subject``: ``orders`` for ``orders-value`` and ``orders-key``
    (TopicNameStrategy, the serializers' default), else the subject's own name (so that a PREFIXED topic ACL
    ``orders`` also covers TopicRecordNameStrategy's ``orders-com.example.Order``)."""
    for suffix in _SUBJECT_SUFFIXES:
        if subject.endswith(suffix) and len(subject) > len(suffix):
            return subject[: -len(suffix)]
    return subject


class MalformedAuthorization(ValueError):
    """An Authorization header that is not ``Basic base64(user:password)``."""


def parse_basic(authorization: str) -> tuple[str, str]:
    """RFC 7617: ``Basic <base64 of user:password>`` (UTF-8) -> (user, password)."""
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        raise MalformedAuthorization(f"authorization scheme {scheme[:32]!r} is not Basic")
    if not token.strip():
        raise MalformedAuthorization("no credentials after Basic")
    try:
        decoded = base64.b64decode(token.strip().encode("ascii"), validate=True).decode("utf-8")
    except (UnicodeError, binascii.Error):
        raise MalformedAuthorization("the Basic credentials are not base64 of UTF-8 text") from None
    user, colon, password = decoded.partition(":")
    if not colon:
        raise MalformedAuthorization("the Basic credentials have no ':' between user and password")
    if not user:
        raise MalformedAuthorization("the Basic credentials have an empty user name")
    return user, password


def verify_password(mechanism: str, credential: ScramCredential, password: str) -> bool:
    """SaltedPassword with the stored salt and iterations, then ClientKey and StoredKey (RFC 5802), compared
    with the stored StoredKey in constant time: the check a SCRAM login makes, without the exchange."""
    h = MECHANISMS[mechanism]
    salted = hi(h, password.encode("utf-8"), credential.salt, credential.iterations)
    client_key = hmac.new(salted, b"Client Key", h).digest()
    return hmac.compare_digest(hashlib.new(h, client_key).digest(), credential.stored_key)


def _fingerprint(credentials: Mapping[str, ScramCredential]) -> bytes:
    parts = []
    for mech in sorted(credentials):
        c = credentials[mech]
        parts.append(b"%s\0%s\0%s\0%d" % (mech.encode(), c.salt.hex().encode(), c.stored_key.hex().encode(),
                                          c.iterations))
    return b"\n".join(parts)


class VerificationCache:
    """Recent successful logins, so that a client sending the same header on every request costs one PBKDF2
    per ``ttl_s``, not one per request. Entries are keyed by an HMAC (with a per-process random key) of the
    user, the password and the user's stored credentials: a changed or deleted credential never matches an
    old entry, and no password is kept. Least recently used entries go past ``max_entries``."""

    def __init__(self, ttl_s: float = 60.0, max_entries: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._secret = secrets.token_bytes(32)
        self._entries: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def key(self, user: str, password: str, credentials: Mapping[str, ScramCredential]) -> bytes:
        mac = hmac.new(self._secret, digestmod=hashlib.sha256)
        for part in (user.encode("utf-8"), password.encode("utf-8"), _fingerprint(credentials)):
            mac.update(len(part).to_bytes(8, "big"))
            mac.update(part)
        return mac.digest()

    def hit(self, key: bytes) -> bool:
        now = self._clock()
        with self._lock:
            expires = self._entries.get(key)
            if expires is None:
                return False
            if expires <= now:
                del self._entries[key]
                return False
            self._entries.move_to_end(key)
            return True

    def add(self, key: bytes) -> None:
        with self._lock:
            self._entries[key] = self._clock() + self.ttl_s
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(slots=True)
class Attempt:
    """One login between the cheap checks and the hashing: ``reason`` set means decided (refused), ``verified``
    means decided (accepted, from the cache); otherwise :meth:`RegistryAuthenticator.verify` decides."""

    user: str
    password: str
    credentials: dict[str, ScramCredential]
    key: bytes = b""
    verified: bool = False
    reason: str | None = None


class RegistryAuthenticator:
    """HTTP basic authentication against the SCRAM users, sans-I/O: :meth:`start` does the cheap part (the
    credential lookup and the cache), :meth:`verify` the PBKDF2; the async edge, the failure delay and the log
    line are in :class:`SchemaRegistrySecurity`."""

    def __init__(self, lookup: CredentialLookup, cache: VerificationCache | None = None) -> None:
        self._lookup = lookup
        self.cache = cache if cache is not None else VerificationCache()

    def start(self, user: str, password: str) -> Attempt:
        credentials = {m: c for m, c in self._lookup(user).items() if m in MECHANISMS}
        attempt = Attempt(user, password, credentials)
        if not credentials:
            attempt.reason = ("unknown user: it has no SCRAM credentials (create them with 'pykbroker scram add', "
                              "'pykbroker user create' or kafka-configs --entity-type users --add-config)")
            return attempt
        attempt.key = self.cache.key(user, password, credentials)
        if self.cache.hit(attempt.key):
            attempt.verified = True
        elif all(c.iterations < MIN_ITERATIONS for c in credentials.values()):
            attempt.reason = f"stored credentials have fewer than {MIN_ITERATIONS} iterations"
        return attempt

    def verify(self, attempt: Attempt) -> str | None:
        """None when the password is right for one of the user's mechanisms, else why not (for the log)."""
        if attempt.reason is not None or attempt.verified:
            return attempt.reason
        usable = {m: c for m, c in attempt.credentials.items() if c.iterations >= MIN_ITERATIONS}
        for mech in sorted(usable):  # SCRAM-SHA-256 first: the cheaper hash
            if verify_password(mech, usable[mech], attempt.password):
                self.cache.add(attempt.key)
                return None
        return "invalid password"

    def check(self, user: str, password: str) -> str | None:
        """:meth:`start` then :meth:`verify`, in the caller's thread."""
        return self.verify(self.start(user, password))


def _principal(principal: str | None) -> KafkaPrincipal:
    if principal is None:
        return KafkaPrincipal.parse(ANONYMOUS)
    return KafkaPrincipal.parse(principal)


def authorize(authorizer: Authorizer | None, principal: str | None, host: str, operation: str,
              subject: str | None) -> bool:
    """The registry's authorization rule over the broker's authorizer (None: everything allowed).

    A subject is protected by TOPIC ACLs on :func:`subject_topic` (READ -> DESCRIBE, WRITE, DELETE,
    DESCRIBE_CONFIGS, ALTER_CONFIGS); no subject (the global config and mode) by CLUSTER ACLs on
    ``kafka-cluster`` (DESCRIBE_CONFIGS, ALTER_CONFIGS; WRITE and DELETE -> ALTER), except READ, which every
    principal may (what it lists is filtered by subject).
    ``super.users`` and ``allow.everyone.if.no.acl.found`` apply as for Kafka requests.
    """
    table: Mapping[str, AclOperation | None] = GLOBAL_OPERATIONS if subject is None else SUBJECT_OPERATIONS
    if operation not in table:
        raise ValueError(f"unknown schema registry operation {operation!r} (one of {', '.join(OPERATIONS)})")
    acl_operation = table[operation]
    if authorizer is None or acl_operation is None:
        return True
    who = _principal(principal)
    if subject is None:
        rtype, name = ResourceType.CLUSTER, CLUSTER_NAME
    else:
        rtype, name = ResourceType.TOPIC, subject_topic(subject)
    ok = authorizer.authorize(who, host, acl_operation, rtype, name)
    if not ok:
        authz_log.info("Denied operation", extra=fields(
            principal=str(who), operation=acl_operation.name, host=host,
            resource_type=rtype.name.title().replace("_", ""), pattern_type="LITERAL", resource_name=name,
            request="SchemaRegistry", registry_operation=operation, subject=subject))
    return ok


class SchemaRegistrySecurity:
    """:class:`~pykbroker.schema_registry.security_api.RegistrySecurity` over the broker's SCRAM users and
    authorizer.

    ``basic``: every request needs ``Authorization: Basic``; a wrong one is answered after
    ``failed_delay_s`` (the broker's connection.failed.authentication.delay.ms, as a failed SASL login) with
    one warning naming the user, never the password. PBKDF2 runs in a worker thread, at most
    ``max_hashing_threads`` at a time, so a burst of logins neither blocks the event loop nor takes every
    thread."""

    def __init__(self, *, basic: bool, lookup: CredentialLookup, authorizer: Authorizer | None,
                 https: bool = False, failed_delay_s: float = 0.1, cache: VerificationCache | None = None,
                 max_hashing_threads: int = 2, authorizer_required: bool = False) -> None:
        self.basic = basic
        self.https = https
        # The broker sets the authorizer once its ACLs are loaded; until then, with authorizer.class.name set,
        # every request is refused rather than allowed.
        self.authorizer = authorizer
        self.authorizer_required = authorizer_required
        self.failed_delay_s = max(failed_delay_s, 0.0)
        self.authenticator = RegistryAuthenticator(lookup, cache)
        self._max_threads = max_hashing_threads
        self._limiter: anyio.CapacityLimiter | None = None

    @classmethod
    def from_config(cls, config: Any, lookup: CredentialLookup, authorizer: Authorizer | None,
                    https: bool) -> SchemaRegistrySecurity:
        """The registry's security from the broker's settings; logs what an operator should know at start."""
        basic = str(config[AUTHENTICATION]).strip().lower() == "basic"
        if basic and not https:
            log.warning("schema registry: basic authentication over http sends passwords in clear text; serve the "
                        "registry over https (ssl.keystore.* or listener.name.schema_registry.ssl.*)")
        if config["authorizer.class.name"] and not basic:
            log.info("schema registry: the authorizer is on and authentication is none, so every registry request "
                     "is %(principal)s: grant its ACLs (or set %(key)s=basic)",
                     {"principal": ANONYMOUS, "key": AUTHENTICATION})
        return cls(basic=basic, lookup=lookup, authorizer=authorizer, https=https,
                   failed_delay_s=config["connection.failed.authentication.delay.ms"] / 1000,
                   authorizer_required=bool(config["authorizer.class.name"]))

    async def authenticate(self, authorization: str | None, peer: str = "") -> str | None:
        if not self.basic:
            return None
        if authorization is None or not authorization.strip():
            raise Unauthorized("authentication required: send HTTP basic credentials of a SCRAM user")
        try:
            user, password = parse_basic(authorization)
        except MalformedAuthorization as e:
            await self._fail(peer, "", str(e))
        attempt = self.authenticator.start(user, password)
        reason = attempt.reason
        if reason is None and not attempt.verified:  # not decided by the cache: PBKDF2 in a worker thread
            if self._limiter is None:
                self._limiter = anyio.CapacityLimiter(self._max_threads)
            reason = await anyio.to_thread.run_sync(self.authenticator.verify, attempt, limiter=self._limiter)
        if reason is not None:
            await self._fail(peer, user, reason)
        return f"{USER_TYPE}:{user}"

    async def _fail(self, peer: str, user: str, reason: str) -> NoReturn:
        log.warning("schema registry: failed authentication",
                    extra=fields(peer=peer, user=user[:256], mechanism="HTTP Basic", reason=reason))
        await anyio.sleep(self.failed_delay_s)
        raise Unauthorized("invalid credentials")

    def authorize(self, principal: str | None, host: str, operation: str, subject: str | None) -> bool:
        if self.authorizer is None and self.authorizer_required:
            log.warning("schema registry: request refused, the authorizer is not loaded yet",
                        extra=fields(principal=principal or ANONYMOUS, operation=operation, subject=subject))
            return False
        return authorize(self.authorizer, principal, host, operation, subject)

    def ssl_context(self, config: Any) -> ssl.SSLContext | None:
        """:func:`server_ssl_context` for an https registry listener, None for http."""
        return server_ssl_context(config) if self.https else None

    def forward_context(self, config: Any) -> ssl.SSLContext | bool:
        """How a broker checks the writer's https registry when it forwards a write: :func:`forward_ssl_context`;
        True (the system's CAs) for an http registry."""
        return forward_ssl_context(config) if self.https else True


def server_ssl_context(config: Any) -> ssl.SSLContext:
    """The server context of the https registry listener: the broker's keystore and truststore settings
    (PEM or PKCS12, as for Kafka's SSL listeners), each overridable as ``listener.name.schema_registry.ssl.*``;
    ``ssl.client.auth=required`` checks client certificates against the truststore. Raises
    :class:`pykbroker.security.tls.TlsConfigError` with the reason."""
    return server_tls(config, LISTENER_NAME).context


def forward_ssl_context(config: Any) -> ssl.SSLContext:
    """The client context of a broker forwarding a write to the writer's https registry: the writer's certificate
    is checked against the truststore (the system's CAs without one) and its host name per
    ``ssl.endpoint.identification.algorithm``; the keystore's certificate is presented, for writers that require
    client certificates. The same ``listener.name.schema_registry.ssl.*`` overrides apply."""
    return client_context(config, LISTENER_NAME)
