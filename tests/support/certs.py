"""Test certificates made with ``cryptography``: a CA, a server certificate for 127.0.0.1/localhost,
client certificates with chosen subjects, an expired one and one from another CA; PEM and PKCS12."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PASSWORD = "changeit-0xtest"


@dataclass(frozen=True)
class Issued:
    cert: Path  # PEM certificate
    key: Path  # PEM unencrypted private key
    p12: Path  # PKCS12 (password PASSWORD) with key, certificate and the CA
    pem: Path  # key + certificate in one PEM file (ssl.keystore.type=PEM)


def _name(subject: dict[str, str]) -> x509.Name:
    oids = {"CN": NameOID.COMMON_NAME, "O": NameOID.ORGANIZATION_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
            "C": NameOID.COUNTRY_NAME, "L": NameOID.LOCALITY_NAME, "ST": NameOID.STATE_OR_PROVINCE_NAME}
    # Written most general first (C, ..., CN) so that the RFC 2253 form starts with CN.
    order = ["C", "ST", "L", "O", "OU", "CN"]
    return x509.Name([x509.NameAttribute(oids[k], subject[k]) for k in order if k in subject])


class CertificateAuthority:
    def __init__(self, directory: Path, name: str = "pykbroker-test-ca") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = _name({"CN": name, "O": "pykbroker tests"})
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(days=1))
                     .not_valid_after(now + datetime.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False),
                                    critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.cert_path = self.dir / f"{name}.pem"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.p12_path = self.dir / f"{name}-truststore.p12"
        self.p12_path.write_bytes(pkcs12.serialize_key_and_certificates(
            None, None, None, [self.cert], serialization.BestAvailableEncryption(PASSWORD.encode())))

    def issue(self, name: str, subject: dict[str, str], *, server: bool = False, expired: bool = False) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        start, end = ((now - datetime.timedelta(days=10), now - datetime.timedelta(days=1)) if expired
                      else (now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)))
        builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        out = Issued(self.dir / f"{name}.crt", self.dir / f"{name}.key", self.dir / f"{name}.p12",
                     self.dir / f"{name}-keystore.pem")
        out.cert.write_bytes(cert_pem)
        out.key.write_bytes(key_pem)
        out.pem.write_bytes(key_pem + cert_pem)
        out.p12.write_bytes(pkcs12.serialize_key_and_certificates(
            name.encode(), key, cert, [self.cert], serialization.BestAvailableEncryption(PASSWORD.encode())))
        return out


@dataclass(frozen=True)
class Pki:
    ca: CertificateAuthority
    server: Issued
    alice: Issued  # CN=alice,OU=ServiceUsers,O=Acme,C=US
    bob: Issued  # CN=Bob,O=Acme
    expired: Issued
    untrusted: Issued  # signed by another CA
    other_ca: CertificateAuthority


def make_pki(directory: Path) -> Pki:
    ca = CertificateAuthority(directory)
    other = CertificateAuthority(directory / "other", "other-ca")
    return Pki(
        ca=ca,
        server=ca.issue("server", {"CN": "localhost", "O": "pykbroker tests"}, server=True),
        alice=ca.issue("alice", {"CN": "alice", "OU": "ServiceUsers", "O": "Acme", "C": "US"}),
        bob=ca.issue("bob", {"CN": "Bob", "O": "Acme"}),
        expired=ca.issue("expired", {"CN": "expired"}, expired=True),
        untrusted=other.issue("mallory", {"CN": "mallory"}),
        other_ca=other,
    )
