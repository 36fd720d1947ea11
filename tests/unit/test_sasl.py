"""SASL: JAAS parsing, PLAIN, SCRAM (RFC 7677 vector), the authenticator state machine, config checks."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from pykbroker import logsetup
from pykbroker.config import BrokerConfig, ConfigError
from pykbroker.security.principal import ANONYMOUS, KafkaPrincipal
from pykbroker.security.sasl.authenticator import SaslAuthenticator, SaslClose, SaslServerSettings, State
from pykbroker.security.sasl.errors import SaslFailure
from pykbroker.security.sasl.jaas import JaasError, parse_jaas, plain_users, single_module
from pykbroker.security.sasl.plain import PlainServer
from pykbroker.security.sasl.scram import ScramClient, ScramCredential, ScramServer
from pykbroker.security.session import Session

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')


# --- JAAS ---------------------------------------------------------------------------------------

def test_jaas_parses_kafka_plain_config() -> None:
    m = single_module(JAAS)
    assert m.class_name == "org.apache.kafka.common.security.plain.PlainLoginModule"
    assert m.flag == "required"
    assert m.options["username"] == "admin" and m.options["password"] == "admin-secret"
    assert plain_users(m) == {"admin": "admin-secret", "alice": "alice-secret"}


def test_jaas_quotes_escapes_and_bare_values() -> None:
    m = single_module('a.B optional k=v q="x;y \\" z" e="";')
    assert m.options == {"k": "v", "q": 'x;y " z', "e": ""}
    assert len(parse_jaas("a required; b sufficient x=1;")) == 2


@pytest.mark.parametrize("text", ["", "a", "a required", "a required k=v", "a badflag;", "a required k;",
                                  'a required k="unterminated;', "a required; b required;"])
def test_jaas_rejects_malformed(text: str) -> None:
    with pytest.raises(JaasError) as e:
        single_module(text)
    assert "unterminated" not in str(e.value)  # messages never quote values


# --- PLAIN --------------------------------------------------------------------------------------

def test_plain_accepts_and_rejects_with_kafka_messages() -> None:
    users = {"alice": "alice-secret"}
    s = PlainServer(users)
    assert s.evaluate(b"\x00alice\x00alice-secret") == b"" and s.complete and s.username == "alice"
    assert PlainServer(users).evaluate(b"alice\x00alice\x00alice-secret") == b""
    for token, message in [
        (b"\x00alice\x00wrong", "Authentication failed: Invalid username or password"),
        (b"\x00bob\x00alice-secret", "Authentication failed: Invalid username or password"),
        (b"\x00\x00pw", "Authentication failed: username not specified"),
        (b"\x00alice\x00", "Authentication failed: password not specified"),
        (b"alice-secret", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
        (b"bob\x00alice\x00alice-secret", "Authentication failed: Client requested an authorization id that is "
                                          "different from username"),
    ]:
        with pytest.raises(SaslFailure) as e:
            PlainServer(users).evaluate(token)
        assert e.value.message == message
        assert "alice-secret" not in e.value.detail and "wrong" not in e.value.detail


# --- SCRAM --------------------------------------------------------------------------------------

def test_scram_sha256_rfc7677_vector() -> None:
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    cred = ScramCredential.from_password("SCRAM-SHA-256", "pencil", 4096, salt)
    server = ScramServer("SCRAM-SHA-256", lambda u, m: cred if u == "user" else None,
                         nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    first = server.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = server.evaluate(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                            b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.complete and server.username == "user"


def test_scram_client_matches_rfc7677_vector() -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first_message() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = client.final_message(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,"
                                 b"i=4096")
    assert final.endswith(b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    client.verify_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(SaslFailure):
        client.verify_server_final(b"v=AAAA")


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_round_trip_and_failures(mech: str) -> None:
    cred = ScramCredential.from_password(mech, "s3cret", 4096)
    assert ScramCredential.from_kafka_string(cred.to_kafka_string()) == cred
    assert "s3cret" not in cred.to_kafka_string()

    def run(password: str, user: str = "alice") -> ScramServer:
        server = ScramServer(mech, lambda u, m: cred if (u, m) == ("alice", mech) else None)
        client = ScramClient(mech, user, password)
        final = client.final_message(server.evaluate(client.first_message()))
        client.verify_server_final(server.evaluate(final))
        return server

    assert run("s3cret").complete
    expected = f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mech}"
    for password, user in [("wrong", "alice"), ("s3cret", "bob")]:
        with pytest.raises(SaslFailure) as e:
            run(password, user)
        assert e.value.message == expected


def test_scram_rejects_channel_binding_and_bad_nonce() -> None:
    cred = ScramCredential.from_password("SCRAM-SHA-256", "pw")
    server = ScramServer("SCRAM-SHA-256", lambda u, m: cred)
    with pytest.raises(SaslFailure):
        server.evaluate(b"p=tls-unique,,n=user,r=abc")
    server = ScramServer("SCRAM-SHA-256", lambda u, m: cred)
    server.evaluate(b"n,,n=user,r=abc")
    with pytest.raises(SaslFailure):
        server.evaluate(b"c=biws,r=abcWRONG,p=AAAA")
    low = ScramCredential.from_password("SCRAM-SHA-256", "pw", iterations=1000)
    with pytest.raises(SaslFailure):
        ScramServer("SCRAM-SHA-256", lambda u, m: low).evaluate(b"n,,n=user,r=abc")


# --- the authenticator state machine ------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _auth(reauth_ms: int = 0, mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-512"),
          ) -> tuple[SaslAuthenticator, Session, Clock]:
    cred = ScramCredential.from_password("SCRAM-SHA-512", "bob-secret")
    settings = SaslServerSettings("SASL_PLAINTEXT", mechanisms, {"alice": "alice-secret", "carol": "c"},
                                  max_reauth_ms=reauth_ms, max_receive_size=1000,
                                  scram_lookup=lambda u, m: cred if (u, m) == ("bob", "SCRAM-SHA-512") else None)
    session = Session("SASL_PLAINTEXT", "SASL_PLAINTEXT", "127.0.0.1:5555")
    clock = Clock()
    return SaslAuthenticator(settings, session, clock), session, clock


def test_only_handshake_and_versions_before_authentication() -> None:
    auth, session, _ = _auth()
    auth.check(18, "ApiVersions", 10)
    auth.check(17, "SaslHandshake", 10)
    with pytest.raises(SaslClose, match="Unexpected Kafka request of type METADATA during SASL handshake"):
        auth.check(3, "METADATA", 10)
    with pytest.raises(SaslClose, match="sasl.server.max.receive.size"):
        auth.check(17, "SaslHandshake", 1001)
    assert session.principal == ANONYMOUS


def test_plain_v1_login_sets_principal(caplog: pytest.LogCaptureFixture) -> None:
    auth, session, _ = _auth()
    assert auth.handshake(1, "PLAIN")["error_code"] == ErrorCode.none
    with pytest.raises(SaslClose):
        auth.check(0, "Produce", 10)
    body = auth.authenticate(2, b"\x00alice\x00alice-secret")
    assert body["error_code"] == ErrorCode.none and body["session_lifetime"] == 0
    assert session.principal == KafkaPrincipal("User", "alice") and auth.authenticated
    auth.check(0, "Produce", 10)
    assert session.reauth_deadline is None
    # SaslAuthenticate without a handshake after login: an error, the session stays (Kafka's KafkaApis)
    assert auth.authenticate(2, b"x")["error_code"] == ErrorCode.illegal_sasl_state
    assert auth.authenticated and session.principal.name == "alice"


def _log_text(caplog: pytest.LogCaptureFixture) -> str:
    """The lines as the broker writes them: the message and its fields."""
    return "\n".join(logsetup.TextFormatter().format(r) for r in caplog.records)


def test_unsupported_mechanism_lists_enabled(caplog: pytest.LogCaptureFixture) -> None:
    auth, _, _ = _auth()
    with caplog.at_level(logging.WARNING):
        body = auth.handshake(1, "GSSAPI")
    assert body == {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": ["PLAIN", "SCRAM-SHA-512"]}
    text = _log_text(caplog)
    assert "127.0.0.1:5555" in text and "GSSAPI" in text
    with pytest.raises(SaslClose):
        auth.check(18, "ApiVersions", 10)


def test_failed_login_logged_without_password(caplog: pytest.LogCaptureFixture) -> None:
    auth, session, _ = _auth()
    auth.handshake(1, "PLAIN")
    with caplog.at_level(logging.WARNING):
        body = auth.authenticate(1, b"\x00alice\x00not-the-password")
    assert body["error_code"] == ErrorCode.sasl_authentication_failed
    assert body["error_message"] == "Authentication failed: Invalid username or password"
    text = _log_text(caplog)
    assert "alice" in text and "127.0.0.1:5555" in text and "PLAIN" in text
    assert "not-the-password" not in text
    assert session.principal == ANONYMOUS and auth.state is State.FAILED
    with pytest.raises(SaslClose):
        auth.check(36, "SaslAuthenticate", 10)


def test_out_of_order_requests_are_illegal_sasl_state() -> None:
    auth, _, _ = _auth()
    assert auth.authenticate(1, b"x")["error_code"] == ErrorCode.illegal_sasl_state
    auth, _, _ = _auth()
    auth.handshake(1, "PLAIN")
    assert auth.handshake(1, "PLAIN")["error_code"] == ErrorCode.illegal_sasl_state


def test_scram_over_authenticate_and_failure_message() -> None:
    auth, session, _ = _auth()
    auth.handshake(1, "SCRAM-SHA-512")
    client = ScramClient("SCRAM-SHA-512", "bob", "bob-secret")
    first = auth.authenticate(2, client.first_message())
    assert first["error_code"] == ErrorCode.none and not auth.authenticated
    final = auth.authenticate(2, client.final_message(first["auth_bytes"]))
    assert final["error_code"] == ErrorCode.none
    client.verify_server_final(final["auth_bytes"])
    assert session.principal == KafkaPrincipal("User", "bob")

    auth, session, _ = _auth()
    auth.handshake(1, "SCRAM-SHA-512")
    client = ScramClient("SCRAM-SHA-512", "bob", "wrong")
    first = auth.authenticate(2, client.first_message())
    final = auth.authenticate(2, client.final_message(first["auth_bytes"]))
    assert final["error_code"] == ErrorCode.sasl_authentication_failed
    assert final["error_message"] == ("Authentication failed during authentication due to invalid credentials with "
                                      "SASL mechanism SCRAM-SHA-512")


def test_handshake_v0_raw_tokens() -> None:
    auth, session, _ = _auth()
    auth.handshake(0, "PLAIN")
    assert auth.expects_raw_token
    assert auth.raw_token(b"\x00alice\x00alice-secret") == b""
    assert session.principal.name == "alice" and not auth.expects_raw_token
    # no KIP-368 re-authentication after a v0 login: ILLEGAL_SASL_STATE, the session goes on
    assert auth.handshake(1, "PLAIN")["error_code"] == ErrorCode.illegal_sasl_state
    assert auth.authenticated
    auth, _, _ = _auth()
    auth.handshake(0, "PLAIN")
    with pytest.raises(SaslClose):
        auth.raw_token(b"\x00alice\x00bad")


def test_reauthentication_kip368() -> None:
    auth, session, clock = _auth(reauth_ms=1000)
    auth.handshake(1, "PLAIN")
    body = auth.authenticate(1, b"\x00alice\x00alice-secret")
    assert body["session_lifetime"] == 1000 and session.reauth_deadline == 101.0
    clock.t = 101.5
    with pytest.raises(SaslClose, match="expired"):
        auth.check(1, "Fetch", 10)
    auth.check(17, "SaslHandshake", 10)
    assert auth.handshake(1, "PLAIN")["error_code"] == ErrorCode.none
    assert auth.authenticate(2, b"\x00alice\x00alice-secret")["error_code"] == ErrorCode.none
    assert session.reauth_deadline == 102.5
    auth.check(1, "Fetch", 10)
    # another principal on re-authentication is refused
    auth.handshake(1, "PLAIN")
    body = auth.authenticate(2, b"\x00carol\x00c")
    assert body["error_code"] == ErrorCode.sasl_authentication_failed
    assert "Cannot change principals" in body["error_message"]
    assert session.principal.name == "alice"


def test_reauthentication_must_keep_mechanism() -> None:
    auth, _, _ = _auth(reauth_ms=1000)
    auth.handshake(1, "PLAIN")
    auth.authenticate(1, b"\x00alice\x00alice-secret")
    assert auth.handshake(1, "SCRAM-SHA-512")["error_code"] == ErrorCode.illegal_sasl_state


# --- config -------------------------------------------------------------------------------------

def _cfg(**extra: str) -> dict[str, str]:
    base = {"listeners": "PLAINTEXT://127.0.0.1:9092,SASL_PLAINTEXT://127.0.0.1:9093"}
    base.update({k.replace("_", "."): v for k, v in extra.items()})
    return base


def _sasl_allowed() -> bool:
    try:
        BrokerConfig({"listeners": "SASL_PLAINTEXT://127.0.0.1:9093", "sasl.enabled.mechanisms": "SCRAM-SHA-256"})
    except ConfigError as e:
        return "not supported yet" not in str(e)
    return True


def test_sasl_listeners_are_accepted() -> None:
    assert _sasl_allowed()


def test_config_default_gssapi_refused() -> None:
    with pytest.raises(ConfigError, match="GSSAPI"):
        BrokerConfig(_cfg())
    with pytest.raises(ConfigError, match="OAUTHBEARER"):
        BrokerConfig({**_cfg(), "sasl.enabled.mechanisms": "OAUTHBEARER"})


def test_config_plain_needs_jaas_and_listener_overrides() -> None:
    with pytest.raises(ConfigError, match="PlainLoginModule"):
        BrokerConfig({**_cfg(), "sasl.enabled.mechanisms": "PLAIN"})
    cfg = BrokerConfig({**_cfg(), "sasl.enabled.mechanisms": "PLAIN",
                        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
                        "listener.name.sasl_plaintext.connections.max.reauth.ms": "5000"})
    from pykbroker.security.sasl.settings import server_settings
    s = server_settings(cfg, lambda u, m: None)["SASL_PLAINTEXT"]
    assert s.mechanisms == ("PLAIN",) and s.plain_users["alice"] == "alice-secret" and s.max_reauth_ms == 5000
    with pytest.raises(ConfigError) as e:
        BrokerConfig({**_cfg(), "sasl.enabled.mechanisms": "PLAIN",
                      "sasl.jaas.config": 'x required password="hunter2"'})
    assert "hunter2" not in str(e.value)


def test_unknown_sasl_keys_fail() -> None:
    with pytest.raises(ConfigError, match="sasl.kerberos.service.name"):
        BrokerConfig({"sasl.kerberos.service.name": "kafka"})


# --- SCRAM admin handlers against the embedded store ----------------------------------------------

def _admin_env(tmp_path: Any) -> tuple[Any, Any]:
    from types import SimpleNamespace

    from pykbroker.metadata.embedded import EmbeddedMetadataStore

    store = EmbeddedMetadataStore(tmp_path, 0, [])
    store.start()
    return SimpleNamespace(store=store), SimpleNamespace(authorizer=None, session=Session())


def _alter(svc: Any, ctx: Any, deletions: list[dict[str, Any]], upsertions: list[dict[str, Any]]) -> dict[str, Any]:
    import asyncio

    from pykbroker.protocol import codec
    from pykbroker.server.handlers.sasl import handle_alter_user_scram_credentials

    req = codec.build(codec.request_class(51, 0), {"deletions": deletions, "upsertions": upsertions})
    body = asyncio.run(handle_alter_user_scram_credentials(svc, ctx, req))
    return {r["user"]: (r["error_code"], r["error_message"]) for r in body["results"]}


def _describe(svc: Any, ctx: Any, users: list[str] | None) -> dict[str, Any]:
    import asyncio

    from pykbroker.protocol import codec
    from pykbroker.server.handlers.sasl import handle_describe_user_scram_credentials

    req = codec.build(codec.request_class(50, 0),
                      {"users": None if users is None else [{"name": u} for u in users]})
    body = asyncio.run(handle_describe_user_scram_credentials(svc, ctx, req))
    return {r["user"]: (r["error_code"], [(i["mechanism"], i["iterations"]) for i in r["credential_infos"]])
            for r in body["results"]}


def test_alter_and_describe_scram_credentials(tmp_path: Any) -> None:
    svc, ctx = _admin_env(tmp_path)
    up = {"name": "alice", "mechanism": 2, "iterations": 8192, "salt": b"salt", "salted_password": b"x" * 64}
    assert _alter(svc, ctx, [], [up]) == {"alice": (ErrorCode.none, None)}
    assert _describe(svc, ctx, None) == {"alice": (ErrorCode.none, [(2, 8192)])}
    assert _describe(svc, ctx, ["alice", "bob"])["bob"][0] == ErrorCode.resource_not_found
    assert _describe(svc, ctx, ["alice", "alice"])["alice"][0] == ErrorCode.duplicate_resource
    cred = svc.store.scram_credentials("alice")["SCRAM-SHA-512"]
    assert cred.iterations == 8192 and cred.salt == b"salt"
    got = _alter(svc, ctx, [], [{**up, "name": "u1", "iterations": 4095}, {**up, "name": "u2", "iterations": 16385},
                                {**up, "name": "u3", "mechanism": 9}, {**up, "name": "u4"}, {**up, "name": "u4"}])
    assert got["u1"] == (ErrorCode.unacceptable_credential, "Too few iterations")
    assert got["u2"] == (ErrorCode.unacceptable_credential, "Too many iterations")
    assert got["u3"] == (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")
    assert got["u4"][0] == ErrorCode.duplicate_resource
    assert set(svc.store.scram_users()) == {"alice"}
    assert _alter(svc, ctx, [{"name": "alice", "mechanism": 1}], [])["alice"][0] == ErrorCode.resource_not_found
    assert _alter(svc, ctx, [{"name": "alice", "mechanism": 2}], []) == {"alice": (ErrorCode.none, None)}
    assert svc.store.scram_users() == {}
    # persisted: a new store over the same directory reads the same (empty) state back
    svc.store.alter_scram_credentials({("zed", "SCRAM-SHA-256"): cred}, [])
    from pykbroker.metadata.embedded import EmbeddedMetadataStore

    again = EmbeddedMetadataStore(tmp_path, 0, [])
    again.start()
    assert again.scram_credentials("zed") == {"SCRAM-SHA-256": cred}


# --- OAUTHBEARER (unsecured JWS) ------------------------------------------------------------------

def _oauth_first(token: str) -> bytes:
    return f"n,,\x01auth=Bearer {token}\x01\x01".encode()


def test_oauthbearer_unsecured_token_accepted() -> None:
    from pykbroker.security.sasl.oauthbearer import OAuthBearerServer, unsecured_token

    s = OAuthBearerServer({}, clock=lambda: 1000.0)
    assert s.evaluate(_oauth_first(unsecured_token("bob", 60, now=990.0))) == b""
    assert s.complete and s.username == "bob" and s.lifetime_ms == 50_000


@pytest.mark.parametrize("token, options", [
    ("TOKEN_EXPIRED", {}),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJib2IiLCJleHAiOjk5OTk5OTk5OTl9.", {}),  # alg HS256
    ("eyJhbGciOiJub25lIn0.eyJleHAiOjk5OTk5OTk5OTl9.", {}),  # no sub
    ("eyJhbGciOiJub25lIn0.eyJzdWIiOiJib2IiLCJleHAiOjk5OTk5OTk5OTl9.c2ln", {}),  # signed
    ("SCOPELESS", {"unsecuredValidatorRequiredScope": "write"}),
])
def test_oauthbearer_rejections(token: str, options: dict[str, str]) -> None:
    from pykbroker.security.sasl.oauthbearer import OAuthBearerServer, unsecured_token

    if token == "TOKEN_EXPIRED":
        token = unsecured_token("bob", 5, now=900.0)
    elif token == "SCOPELESS":
        token = unsecured_token("bob", 500, now=900.0, scope="read")
    s = OAuthBearerServer(options, clock=lambda: 1000.0)
    assert s.evaluate(_oauth_first(token)) == b'{"status": "invalid_token"}'
    assert not s.complete
    with pytest.raises(SaslFailure) as e:
        s.evaluate(b"\x01")
    assert e.value.message == '{"status": "invalid_token"}'


def test_oauthbearer_session_lifetime_capped_by_token() -> None:
    from pykbroker.security.sasl.oauthbearer import unsecured_token

    auth, session, clock = _auth(reauth_ms=3_600_000, mechanisms=("OAUTHBEARER",))
    clock.t = __import__("time").time()
    auth.handshake(1, "OAUTHBEARER")
    body = auth.authenticate(2, _oauth_first(unsecured_token("dave", 30)))
    assert body["error_code"] == ErrorCode.none and session.principal.name == "dave"
    assert 25_000 <= body["session_lifetime"] <= 30_000


# --- the inter-broker client side against the server state machine -------------------------------

class _LoopbackClient:
    """A BrokerClient stand-in whose requests go straight into a server-side authenticator."""

    host, port = "127.0.0.1", 9093

    def __init__(self, auth: SaslAuthenticator) -> None:
        self.auth = auth

    async def request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        from types import SimpleNamespace

        if api_key == 17:
            return SimpleNamespace(**self.auth.handshake(version, body["mechanism"]))
        return SimpleNamespace(**self.auth.authenticate(version, body["auth_bytes"]))


@pytest.mark.parametrize("mechanism, user, password, ok", [
    ("PLAIN", "alice", "alice-secret", True), ("PLAIN", "alice", "nope", False),
    ("SCRAM-SHA-512", "bob", "bob-secret", True), ("SCRAM-SHA-512", "bob", "nope", False),
    ("SCRAM-SHA-256", "bob", "bob-secret", False),  # not enabled
])
def test_inter_broker_client_login(mechanism: str, user: str, password: str, ok: bool) -> None:
    import asyncio

    from pykbroker.protocol.framing import BrokerConnectionError
    from pykbroker.security.sasl.client import authenticate
    from pykbroker.security.sasl.settings import ClientCredentials

    auth, session, _ = _auth()
    creds = ClientCredentials(mechanism, user, password)
    assert password not in repr(creds)
    if ok:
        asyncio.run(authenticate(_LoopbackClient(auth), creds))
        assert session.principal == KafkaPrincipal("User", user)
    else:
        with pytest.raises(BrokerConnectionError):
            asyncio.run(authenticate(_LoopbackClient(auth), creds))
        assert session.principal == ANONYMOUS


def test_inter_broker_credentials_from_listener_jaas() -> None:
    from pykbroker.security.sasl.settings import inter_broker_credentials

    scram = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" '
             'password="broker-secret";')
    base = {**_cfg(), "inter.broker.listener.name": "SASL_PLAINTEXT", "sasl.enabled.mechanisms": "SCRAM-SHA-512"}
    with pytest.raises(ConfigError, match="sasl.mechanism.inter.broker.protocol"):
        BrokerConfig(base)  # GSSAPI by default
    cfg = BrokerConfig({**base, "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
                        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": scram})
    creds = inter_broker_credentials(cfg)
    assert creds is not None and (creds.mechanism, creds.username, creds.password) == \
        ("SCRAM-SHA-512", "broker", "broker-secret")
    with pytest.raises(ConfigError, match="username and password"):
        BrokerConfig({**base, "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512"})
    with pytest.raises(ConfigError, match="not enabled"):
        BrokerConfig({**base, "sasl.mechanism.inter.broker.protocol": "PLAIN"})
    assert inter_broker_credentials(BrokerConfig(_cfg(**{"sasl.enabled.mechanisms": "SCRAM-SHA-256"}))) is None
