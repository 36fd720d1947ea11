"""The client's connection settings, as librdkafka properties: from a properties file, the environment and
``-X key=value``, so that what works for kcat or a confluent-kafka application works here (TLS and SASL too)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from .errors import EXIT_USAGE, AdminError

ENV_BOOTSTRAP = "PYKBROKER_BOOTSTRAP_SERVERS"
ENV_CONFIG = "PYKBROKER_CLIENT_CONFIG"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def client_properties(bootstrap: str | None, config_file: str | None, overrides: Iterable[str],
                      environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The properties of every client a command makes. Later wins: the file (``--command-config``, else
    $PYKBROKER_CLIENT_CONFIG), $PYKBROKER_BOOTSTRAP_SERVERS, ``-X``, then ``-b``."""
    props: dict[str, str] = {}
    path = config_file or environ.get(ENV_CONFIG)
    if path:
        # Only with a file: the config package is slow to import, and most command lines name no file.
        from pykbroker.config.parsing import parse_properties

        try:
            props.update(parse_properties(Path(path).read_text()))
        except OSError as e:
            raise AdminError(f"cannot read the client config {path}: {e.strerror}", EXIT_USAGE) from e
    if environ.get(ENV_BOOTSTRAP):
        props["bootstrap.servers"] = environ[ENV_BOOTSTRAP]
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise AdminError(f"-X takes key=value, not {item!r}", EXIT_USAGE)
        props[key.strip()] = value
    if bootstrap:
        props["bootstrap.servers"] = bootstrap
    props.setdefault("bootstrap.servers", DEFAULT_BOOTSTRAP)
    return props


def redacted(props: Mapping[str, str]) -> dict[str, str]:
    """The properties with every secret replaced, for messages and logs."""
    secret = ("password", "secret", "sasl.jaas.config", "ssl.key.pem", "token")
    return {k: ("[hidden]" if any(s in k for s in secret) else v) for k, v in props.items()}
