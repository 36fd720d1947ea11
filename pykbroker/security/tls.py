"""TLS for SSL and SASL_SSL listeners: an ``ssl.SSLContext`` per listener from Kafka's ssl.* keys.

Every key may be set for one listener as ``listener.name.<l>.ssl.*``.  Keystores are PEM (files or
inline ``ssl.keystore.key`` / ``ssl.keystore.certificate.chain``) or PKCS12 (converted to PEM in
memory with ``cryptography``); JKS is refused.  Any problem (missing file, wrong password, key not
matching the certificate) raises ``TlsConfigError`` with a one-line reason, so the broker refuses
to start.  ``ssl.load_cert_chain`` reads files only, so PEM built in memory goes through a private
0600 temporary file deleted right after loading.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from dataclasses import dataclass
from typing import Any

from pykbroker.security.principal import ANONYMOUS, KafkaPrincipal
from pykbroker.security.principal_mapping import MappingError, Rule, dn_from_ssl_subject, map_dn, parse_rules

TLS_PROTOCOLS = ("SSL", "SASL_SSL")
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


class TlsConfigError(ValueError):
    """A listener's TLS settings cannot be used."""


def setting(config: Any, listener: str, key: str) -> Any:
    """The listener's own value of an ssl.* key, else the broker-wide one."""
    value = config.listener_value(listener, key)
    return value if value is not None else config[key]


@dataclass(slots=True)
class ListenerTls:
    listener: str
    context: ssl.SSLContext
    rules: list[Rule]

    def principal(self, peercert: dict[str, Any] | None) -> KafkaPrincipal:
        """The principal of a connection from its client certificate (User:ANONYMOUS without one)."""
        if not peercert or not peercert.get("subject"):
            return ANONYMOUS
        return KafkaPrincipal("User", map_dn(self.rules, dn_from_ssl_subject(peercert["subject"])))


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TlsConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None


def _pkcs12(data: bytes, password: str | None, what: str) -> tuple[bytes | None, bytes, list[bytes]]:
    """(key PEM or None, leaf cert PEM or b"", other certs PEM) of a PKCS12 file."""
    # Loaded only for a PKCS12 keystore: importing cryptography costs a broker without one ~0.1 s at start.
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, pkcs12

    try:
        key, cert, extra = pkcs12.load_key_and_certificates(data, password.encode() if password else None)
    except ValueError as e:
        raise TlsConfigError(f"cannot load {what} (wrong password or not PKCS12): {e}") from None
    key_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()) if key is not None else None
    cert_pem = cert.public_bytes(Encoding.PEM) if cert is not None else b""
    return key_pem, cert_pem, [c.public_bytes(Encoding.PEM) for c in extra]


def _load_chain(ctx: ssl.SSLContext, chain_pem: bytes, key_pem: bytes, password: str | None, what: str) -> None:
    fd, path = tempfile.mkstemp(prefix="pykbroker-key-", suffix=".pem")  # created 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem.rstrip() + b"\n" + chain_pem)
        ctx.load_cert_chain(path, password=password or None)
    except ssl.SSLError as e:
        raise TlsConfigError(f"cannot load {what}: {e.reason or e} (wrong key password, or the key does not "
                             "match the certificate?)") from None
    finally:
        os.unlink(path)


def _key_password(config: Any, listener: str) -> str | None:
    return setting(config, listener, "ssl.key.password") or setting(config, listener, "ssl.keystore.password")


def _load_keystore(ctx: ssl.SSLContext, config: Any, listener: str, required: bool) -> None:
    kind = setting(config, listener, "ssl.keystore.type")
    location = setting(config, listener, "ssl.keystore.location")
    inline_key = setting(config, listener, "ssl.keystore.key")
    inline_chain = setting(config, listener, "ssl.keystore.certificate.chain")
    what = f"keystore of listener {listener}"
    if not location and not inline_key:
        if required:
            raise TlsConfigError(f"listener {listener} has no keystore: set ssl.keystore.location (or "
                                 "ssl.keystore.key and ssl.keystore.certificate.chain with ssl.keystore.type=PEM)")
        return
    if kind == "JKS":
        raise TlsConfigError(f"ssl.keystore.type JKS (Kafka's default) is not implemented: set "
                             f"ssl.keystore.type=PKCS12 or PEM for listener {listener}")
    if kind == "PKCS12":
        if not location:
            raise TlsConfigError(f"ssl.keystore.type=PKCS12 needs ssl.keystore.location ({what})")
        key_pem, cert_pem, extra = _pkcs12(_read(location, what), setting(config, listener, "ssl.keystore.password"),
                                           what)
        if key_pem is None or not cert_pem:
            raise TlsConfigError(f"{what} {location} holds no private key and certificate")
        _load_chain(ctx, cert_pem + b"".join(extra), key_pem, None, what)
        return
    if inline_key:
        if not inline_chain:
            raise TlsConfigError(f"ssl.keystore.key needs ssl.keystore.certificate.chain ({what})")
        _load_chain(ctx, inline_chain.encode(), inline_key.encode(), setting(config, listener, "ssl.key.password"),
                    what)
        return
    data = _read(location, what)
    if b"PRIVATE KEY" not in data:
        raise TlsConfigError(f"{what} {location} holds no PEM private key")
    try:
        ctx.load_cert_chain(location, password=_key_password(config, listener))
    except ssl.SSLError as e:
        raise TlsConfigError(f"cannot load {what} {location}: {e.reason or e} (wrong ssl.key.password, or the "
                             "key does not match the certificate?)") from None


def _load_truststore(ctx: ssl.SSLContext, config: Any, listener: str) -> bool:
    """Load the trusted CAs; False when none are configured."""
    kind = setting(config, listener, "ssl.truststore.type")
    location = setting(config, listener, "ssl.truststore.location")
    inline = setting(config, listener, "ssl.truststore.certificates")
    what = f"truststore of listener {listener}"
    if not location and not inline:
        return False
    if kind == "JKS":
        raise TlsConfigError(f"ssl.truststore.type JKS (Kafka's default) is not implemented: set "
                             f"ssl.truststore.type=PKCS12 or PEM for listener {listener}")
    try:
        if inline:
            ctx.load_verify_locations(cadata=inline)
        elif kind == "PKCS12":
            _key, cert, extra = _pkcs12(_read(location, what), setting(config, listener, "ssl.truststore.password"),
                                        what)
            pems = b"".join([cert, *extra])
            if not pems:
                raise TlsConfigError(f"{what} {location} holds no certificates")
            ctx.load_verify_locations(cadata=pems.decode())
        else:
            _read(location, what)
            ctx.load_verify_locations(cafile=location)
    except ssl.SSLError as e:
        raise TlsConfigError(f"cannot load {what}: {e.reason or e}") from None
    return True


def _common(ctx: ssl.SSLContext, config: Any, listener: str) -> None:
    versions = setting(config, listener, "ssl.enabled.protocols")
    unknown = [v for v in versions if v not in _VERSIONS]
    if unknown or not versions:
        raise TlsConfigError(f"ssl.enabled.protocols of listener {listener}: {','.join(unknown) or 'empty'} not "
                             "supported (TLSv1.2, TLSv1.3)")
    ctx.minimum_version = min((_VERSIONS[v] for v in versions), key=lambda v: v.value)
    ctx.maximum_version = max((_VERSIONS[v] for v in versions), key=lambda v: v.value)
    # ssl.protocol names the context's protocol, as Java's SSLContext.getInstance does: a TLSv1.2 context
    # never speaks TLSv1.3 even when ssl.enabled.protocols lists it ("TLS" and "TLSv1.3" cap nothing).
    if setting(config, listener, "ssl.protocol") == "TLSv1.2":
        if ctx.minimum_version.value > ssl.TLSVersion.TLSv1_2.value:
            raise TlsConfigError(f"listener {listener}: ssl.protocol=TLSv1.2 but ssl.enabled.protocols has only "
                                 "TLSv1.3")
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ciphers = setting(config, listener, "ssl.cipher.suites")
    if ciphers:
        try:
            ctx.set_ciphers(":".join(ciphers))
        except ssl.SSLError:
            raise TlsConfigError(f"ssl.cipher.suites of listener {listener}: no usable cipher in "
                                 f"{','.join(ciphers)} (OpenSSL names)") from None


def server_tls(config: Any, listener: str) -> ListenerTls:
    """The server-side TLS of one SSL/SASL_SSL listener; raises TlsConfigError."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _common(ctx, config, listener)
    _load_keystore(ctx, config, listener, required=True)
    client_auth = setting(config, listener, "ssl.client.auth")
    has_trust = _load_truststore(ctx, config, listener)
    if client_auth != "none":
        if not has_trust:
            raise TlsConfigError(f"ssl.client.auth={client_auth} on listener {listener} needs a truststore "
                                 "(ssl.truststore.location or ssl.truststore.certificates)")
        ctx.verify_mode = ssl.CERT_REQUIRED if client_auth == "required" else ssl.CERT_OPTIONAL
    try:
        rules = parse_rules(setting(config, listener, "ssl.principal.mapping.rules"))
    except MappingError as e:
        raise TlsConfigError(f"ssl.principal.mapping.rules of listener {listener}: {e}") from None
    return ListenerTls(listener, ctx, rules)


def client_context(config: Any, listener: str) -> ssl.SSLContext:
    """A client context for the broker's own connections to another broker's ``listener``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _common(ctx, config, listener)
    if not _load_truststore(ctx, config, listener):
        ctx.load_default_certs()
    _load_keystore(ctx, config, listener, required=False)
    ctx.check_hostname = setting(config, listener, "ssl.endpoint.identification.algorithm").lower() == "https"
    return ctx


def listener_tls(config: Any) -> dict[str, ListenerTls]:
    """TLS of every SSL/SASL_SSL listener (built at start so that errors stop the broker)."""
    return {name: server_tls(config, name) for name, proto in config.security_protocols.items()
            if proto in TLS_PROTOCOLS}
