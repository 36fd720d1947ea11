"""SASL settings from the broker config: validation at start and per-listener server settings.

JAAS text for a listener and mechanism is looked up as Kafka does, most specific first:
``listener.name.<l>.<mechanism lower-case>.sasl.jaas.config``, ``listener.name.<l>.sasl.jaas.config``,
then ``sasl.jaas.config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pykbroker.hints import NOT_IMPLEMENTED_HINT
from pykbroker.security.sasl import CLIENT_MECHANISMS, IMPLEMENTED_MECHANISMS
from pykbroker.security.sasl.authenticator import SaslServerSettings
from pykbroker.security.sasl.jaas import (
    OAUTHBEARER_LOGIN_MODULE,
    PLAIN_LOGIN_MODULE,
    SCRAM_LOGIN_MODULE,
    JaasError,
    LoginModule,
    plain_users,
    single_module,
)
from pykbroker.security.sasl.scram import CredentialLookup

_WHY_NOT = {
    "GSSAPI": "GSSAPI (Kerberos) is not implemented",
}


def _value(config: Any, listener: str, key: str) -> Any:
    own = config.listener_value(listener, key)
    return own if own is not None else config[key]


def jaas_text(config: Any, listener: str, mechanism: str) -> tuple[str | None, str]:
    """(JAAS text, the key it came from) for a listener and mechanism."""
    key = f"{mechanism.lower()}.sasl.jaas.config"
    own = config.listener_value(listener, key)
    if own is not None:
        return own, f"listener.name.{listener.lower()}.{key}"
    own = config.listener_value(listener, "sasl.jaas.config")
    if own is not None:
        return own, f"listener.name.{listener.lower()}.sasl.jaas.config"
    return config["sasl.jaas.config"], "sasl.jaas.config"


def _module(config: Any, listener: str, mechanism: str) -> tuple[LoginModule | None, str]:
    text, key = jaas_text(config, listener, mechanism)
    if text is None or not text.strip():
        return None, key
    try:
        return single_module(text), key
    except JaasError as e:
        raise ValueError(f"configuration '{key}' is not a valid JAAS configuration: {e}") from None


def _mechanisms(config: Any, listener: str) -> list[str]:
    return [m.strip().upper() for m in _value(config, listener, "sasl.enabled.mechanisms")]


def sasl_listeners(config: Any) -> list[str]:
    return [name for name, proto in config.security_protocols.items() if proto in ("SASL_PLAINTEXT", "SASL_SSL")]


def check_config(config: Any) -> None:
    """Refuse at start what would not work; raises ValueError with the reason (never a secret)."""
    for listener in sasl_listeners(config):
        mechanisms = _mechanisms(config, listener)
        prefix = f"listener.name.{listener.lower()}."
        if not mechanisms:
            raise ValueError(f"listener {listener} uses SASL but 'sasl.enabled.mechanisms' is empty")
        for mech in mechanisms:
            if mech not in IMPLEMENTED_MECHANISMS:
                why = _WHY_NOT.get(mech, f"SASL mechanism {mech} is not implemented")
                raise ValueError(
                    f"listener {listener}: {why}; set 'sasl.enabled.mechanisms' (or '{prefix}sasl.enabled."
                    f"mechanisms') to some of {', '.join(IMPLEMENTED_MECHANISMS)} (Kafka's default is GSSAPI) "
                    f"({NOT_IMPLEMENTED_HINT})")
            module, key = _module(config, listener, mech)
            if mech == "PLAIN":
                if module is None or module.class_name != PLAIN_LOGIN_MODULE:
                    raise ValueError(f"listener {listener} enables PLAIN but has no {PLAIN_LOGIN_MODULE} JAAS "
                                     f"configuration (set '{prefix}plain.sasl.jaas.config')")
                if not plain_users(module):
                    raise ValueError(f"configuration '{key}' defines no user_<name>=\"<password>\" option: "
                                     "no PLAIN login could succeed")
            if mech == "OAUTHBEARER" and (module is None or module.class_name != OAUTHBEARER_LOGIN_MODULE):
                raise ValueError(f"listener {listener} enables OAUTHBEARER but has no {OAUTHBEARER_LOGIN_MODULE} "
                                 f"JAAS configuration (set '{prefix}oauthbearer.sasl.jaas.config'); only unsecured "
                                 "JWS tokens are validated (Kafka's default validator)")
    inter: str = config.inter_broker_listener
    if config.security_protocols.get(inter) in ("SASL_PLAINTEXT", "SASL_SSL"):
        mech = str(config["sasl.mechanism.inter.broker.protocol"]).strip().upper()
        if mech not in CLIENT_MECHANISMS:
            raise ValueError(f"inter-broker listener {inter} uses SASL with 'sasl.mechanism.inter.broker.protocol'="
                             f"{mech}, which is not implemented: set it to one of {', '.join(CLIENT_MECHANISMS)} "
                             f"({NOT_IMPLEMENTED_HINT})")
        if mech not in _mechanisms(config, inter):
            raise ValueError(f"'sasl.mechanism.inter.broker.protocol'={mech} is not enabled on the inter-broker "
                             f"listener {inter} ('sasl.enabled.mechanisms')")
        creds = inter_broker_credentials(config)
        if creds is None:
            raise ValueError(f"inter-broker listener {inter} uses SASL/{mech}: its JAAS configuration needs the "
                             "username and password options the broker logs in with")


@dataclass(frozen=True)
class ClientCredentials:
    mechanism: str
    username: str
    password: str

    def __repr__(self) -> str:  # never print the password
        return f"ClientCredentials({self.mechanism}, {self.username!r})"


def inter_broker_credentials(config: Any) -> ClientCredentials | None:
    """What this broker logs in with on the inter-broker listener, or None when it is not SASL."""
    inter: str = config.inter_broker_listener
    if config.security_protocols.get(inter) not in ("SASL_PLAINTEXT", "SASL_SSL"):
        return None
    mech = str(config["sasl.mechanism.inter.broker.protocol"]).strip().upper()
    module, _ = _module(config, inter, mech)
    if module is None or module.class_name not in (PLAIN_LOGIN_MODULE, SCRAM_LOGIN_MODULE):
        return None
    user, password = module.options.get("username"), module.options.get("password")
    if not user or password is None:
        return None
    return ClientCredentials(mech, user, password)


def server_settings(config: Any, scram_lookup: CredentialLookup) -> dict[str, SaslServerSettings]:
    """Listener name -> its SASL server settings, for every SASL_* listener."""
    out: dict[str, SaslServerSettings] = {}
    for listener in sasl_listeners(config):
        mechanisms = tuple(_mechanisms(config, listener))
        users: dict[str, str] = {}
        if "PLAIN" in mechanisms:
            module, _ = _module(config, listener, "PLAIN")
            users = plain_users(module) if module is not None else {}
        oauth: dict[str, str] = {}
        if "OAUTHBEARER" in mechanisms:
            module, _ = _module(config, listener, "OAUTHBEARER")
            oauth = dict(module.options) if module is not None else {}
        out[listener] = SaslServerSettings(
            listener, mechanisms, users,
            max_reauth_ms=int(_value(config, listener, "connections.max.reauth.ms")),
            max_receive_size=int(_value(config, listener, "sasl.server.max.receive.size")),
            scram_lookup=scram_lookup,
            oauthbearer_options=oauth,
        )
    return out
