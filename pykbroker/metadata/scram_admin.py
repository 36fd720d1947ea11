"""SCRAM users written straight into the metadata store, for the first users of a cluster.

A broker whose listeners all require SASL can only let in users that already exist. Kafka creates those
offline: ``kafka-configs --zookeeper`` in ZooKeeper mode, ``kafka-storage format --add-scram`` in KRaft.
``pykbroker scram`` (cli) does the same through this module, for both of pykbroker's metadata stores:

- the embedded store: the metadata file in a stopped broker's data directory, refused while a broker
  holds the directory's lock (the broker reads the file at start);
- ZooKeeper: ``/config/users/<user>`` with a ``/config/changes`` notification, as Kafka's tools write it,
  before or while the brokers run (running brokers follow their watches on ``/config/users``).

Credentials come from ``security.sasl.scram``: only the salt, the keys and the iteration count are stored.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from pykbroker.config import ConfigError, load_config
from pykbroker.metadata import zk_layout as zl
from pykbroker.metadata.embedded import DataDirInUse, EmbeddedMetadataStore
from pykbroker.metadata.zk_client import ZkConnectError, edit_entity_configs, scram_edits, scram_entries, start_client
from pykbroker.security.sasl.scram import MAX_ITERATIONS, MECHANISMS, MIN_ITERATIONS, ScramCredential

DEFAULT_ITERATIONS = MIN_ITERATIONS  # kafka-configs' default
# Kafka's default zookeeper.session.timeout.ms, for a bare --zookeeper connect string.
DEFAULT_ZK_TIMEOUT_MS = 18000


class ScramAdminError(Exception):
    """Why the command did nothing, in one line for the operator."""


@dataclass(frozen=True)
class CredentialRequest:
    """One mechanism's credential to create or replace."""

    mechanism: str
    password: str
    iterations: int = DEFAULT_ITERATIONS

    def __repr__(self) -> str:  # never print the password
        return f"CredentialRequest({self.mechanism}, iterations={self.iterations})"


def check_mechanism(name: str) -> str:
    mech = name.strip().upper()
    if mech not in MECHANISMS:
        raise ScramAdminError(f"Unknown SCRAM mechanism {name!r}: use one of {', '.join(MECHANISMS)}")
    return mech


def check_request(user: str, request: CredentialRequest) -> None:
    """The checks AlterUserScramCredentials makes (the same bounds, so a user created offline could have
    been created online too)."""
    if not user:
        raise ScramAdminError("Username must not be empty")
    check_mechanism(request.mechanism)
    if request.iterations < MIN_ITERATIONS:
        raise ScramAdminError(f"Too few iterations: {request.iterations} (at least {MIN_ITERATIONS})")
    if request.iterations > MAX_ITERATIONS:
        raise ScramAdminError(f"Too many iterations: {request.iterations} (at most {MAX_ITERATIONS})")
    if not request.password:
        raise ScramAdminError(f"empty password for {request.mechanism}")


_ADD_ENTRY = re.compile(r"\s*([A-Za-z0-9-]+)\s*=\s*\[([^\]]*)\]\s*(?:,|$)")


def parse_add_config(text: str) -> list[tuple[str, str | None, int | None]]:
    """kafka-configs' ``--add-config`` for SCRAM users: ``SCRAM-SHA-256=[iterations=8192,password=alice-secret],
    SCRAM-SHA-512=[password=alice-secret]`` -> [(mechanism, password or None, iterations or None)]."""
    out: list[tuple[str, str | None, int | None]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _ADD_ENTRY.match(text, pos)
        if m is None:
            raise ScramAdminError(f"--add-config: expected MECHANISM=[password=...,iterations=...] at "
                                  f"{text[pos:pos + 40]!r}")
        mech = check_mechanism(m.group(1))
        fields: dict[str, str] = {}
        for part in m.group(2).split(","):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in ("password", "iterations"):
                raise ScramAdminError(f"--add-config {mech}: unknown entry {key!r} (password, iterations)")
            fields[key] = value
        iterations = fields.get("iterations")
        if iterations is not None and not iterations.strip().isdigit():
            raise ScramAdminError(f"--add-config {mech}: iterations={iterations!r} is not a number")
        out.append((mech, fields.get("password"), int(iterations) if iterations is not None else None))
        pos = m.end()
    if not out:
        raise ScramAdminError("--add-config: no SCRAM mechanism given")
    return out


def parse_delete_config(text: str) -> list[str]:
    """kafka-configs' ``--delete-config 'SCRAM-SHA-512'`` (comma-separated mechanisms)."""
    names = [n for n in (p.strip() for p in text.split(",")) if n]
    if not names:
        raise ScramAdminError("--delete-config: no SCRAM mechanism given")
    return [check_mechanism(n) for n in names]


class CredentialStore(ABC):
    """Where the brokers read SCRAM credentials, opened by an offline tool."""

    where: str  # for messages: "data directory /x" or "ZooKeeper h:p/chroot"

    @abstractmethod
    def users(self) -> dict[str, dict[str, str]]:
        """user -> mechanism -> Kafka's credential string (salt=..,stored_key=..,server_key=..,iterations=n)."""

    @abstractmethod
    def alter(self, upserts: dict[tuple[str, str], ScramCredential], deletions: list[tuple[str, str]]) -> None:
        """Write the (user, mechanism) upserts and deletions in one update."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> CredentialStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EmbeddedCredentials(CredentialStore):
    """The embedded metadata file of a stopped broker (its first log dir)."""

    def __init__(self, data_dir: Path, *, create: bool = True) -> None:
        """``create``: a directory that does not exist yet is made (the first user of a broker never started);
        otherwise it is an error (a mistyped directory must not read as an empty store)."""
        self.where = f"data directory {data_dir}"
        if not create and not data_dir.is_dir():
            raise ScramAdminError(f"{data_dir} is not a directory: no broker has run there")
        try:
            self._store = EmbeddedMetadataStore.offline(data_dir)
        except DataDirInUse as e:
            raise ScramAdminError(
                f"{e} Stop the broker first (it reads the credentials at start), or go through the running "
                "broker: AlterUserScramCredentials / DescribeUserScramCredentials (kafka-configs "
                "--bootstrap-server ... --user NAME --alter --add-config 'SCRAM-SHA-512=[password=...]').") from None
        except (OSError, ValueError) as e:
            raise ScramAdminError(f"cannot read the metadata of {self.where}: {e}") from None

    def users(self) -> dict[str, dict[str, str]]:
        return self._store.scram_users()

    def alter(self, upserts: dict[tuple[str, str], ScramCredential], deletions: list[tuple[str, str]]) -> None:
        try:
            self._store.alter_scram_credentials(upserts, deletions)
        except OSError as e:
            raise ScramAdminError(f"cannot write the metadata of {self.where}: {e}") from None

    def close(self) -> None:
        self._store.close()


class ZooKeeperCredentials(CredentialStore):
    """Kafka's ZooKeeper layout: the SCRAM config keys of /config/users/<user>."""

    def __init__(self, connect: str, session_timeout_ms: int = DEFAULT_ZK_TIMEOUT_MS,
                 connection_timeout_ms: int | None = None) -> None:
        self.where = f"ZooKeeper {connect}"
        self._timeout = max(session_timeout_ms / 1000.0, 1.0)
        try:
            self._zk = start_client(connect, session_timeout_ms,
                                                 connection_timeout_ms or session_timeout_ms)
        except ZkConnectError as e:
            raise ScramAdminError(str(e)) from None

    def users(self) -> dict[str, dict[str, str]]:
        with self._errors():
            try:
                names = sorted(self._zk.get_children(zl.CONFIG_USERS))
            except NoNodeError:
                return {}
            out: dict[str, dict[str, str]] = {}
            for name in names:
                try:
                    data, _ = self._zk.get(f"{zl.CONFIG_USERS}/{name}")
                except NoNodeError:
                    continue
                try:
                    creds = scram_entries(zl.decode_entity_config(data)) if data else {}
                except (ValueError, AttributeError, TypeError):
                    raise ScramAdminError(f"{zl.CONFIG_USERS}/{name} in {self.where} is not a config "
                                          "znode's JSON") from None
                if creds:
                    out[zl.desanitize(name)] = creds
            return out

    def alter(self, upserts: dict[tuple[str, str], ScramCredential], deletions: list[tuple[str, str]]) -> None:
        edits = {zl.quota_entity_path((("user", u),)): ops for u, ops in scram_edits(upserts, deletions).items()}
        with self._errors():
            self._zk.ensure_path(zl.CONFIG_USERS)
            self._zk.ensure_path(zl.CONFIG_CHANGES)
            if not edit_entity_configs(self._zk, edits, self._timeout):
                raise ScramAdminError(f"{', '.join(edits)} in {self.where} kept changing; nothing written")

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except (KazooException, KazooTimeoutError) as e:
            raise ScramAdminError(f"{self.where}: {type(e).__name__} {e}".rstrip()) from None

    def close(self) -> None:
        self._zk.stop()
        self._zk.close()


def open_store(*, config_file: str | None = None, log_dirs: str | None = None, zookeeper: str | None = None,
               create: bool = True) -> CredentialStore:
    """The store a broker reads credentials from: the one its configuration names (``zookeeper.connect``,
    else the first of ``log.dirs``), a data directory, or a ZooKeeper connect string (with its chroot).
    ``create``: whether a data directory that does not exist may be made (to add a user, not to read)."""
    if zookeeper is not None:
        if not zookeeper.strip():
            raise ScramAdminError("--zookeeper: empty connect string")
        return ZooKeeperCredentials(zookeeper.strip())
    if log_dirs is not None:
        first = log_dirs.split(",")[0].strip()
        if not first:
            raise ScramAdminError("--log-dirs: empty directory")
        return EmbeddedCredentials(Path(first), create=create)
    try:
        config = load_config(config_file, [])
    except ConfigError as e:
        raise ScramAdminError(f"invalid configuration: {e}") from None
    connect = str(config["zookeeper.connect"]).strip()
    if connect:
        conn = config["zookeeper.connection.timeout.ms"]
        return ZooKeeperCredentials(connect, int(config["zookeeper.session.timeout.ms"]),
                                    int(conn) if conn is not None else None)
    return EmbeddedCredentials(config.log_dirs[0], create=create)


def add(store: CredentialStore, user: str, requests: list[CredentialRequest]) -> str:
    """Create or replace the user's credential for each mechanism (a fresh random salt each)."""
    if not requests:
        raise ScramAdminError("no SCRAM mechanism given")
    seen: set[str] = set()
    for r in requests:
        check_request(user, r)
        if r.mechanism in seen:
            raise ScramAdminError("A user credential cannot be altered twice in the same request")
        seen.add(r.mechanism)
    upserts = {(user, r.mechanism): ScramCredential.from_password(r.mechanism, r.password, r.iterations)
               for r in requests}
    store.alter(upserts, [])
    return f"Completed updating config for user {user}."


def delete(store: CredentialStore, user: str, mechanisms: list[str] | None) -> str:
    """Delete some of the user's mechanisms (None: all of them)."""
    if not user:
        raise ScramAdminError("Username must not be empty")
    have = set(store.users().get(user, {}))
    wanted = sorted(have) if mechanisms is None else [check_mechanism(m) for m in mechanisms]
    missing = [m for m in wanted if m not in have]
    if missing or not wanted:
        what = ", ".join(missing) if missing else "no SCRAM credentials"
        raise ScramAdminError(f"Attempt to delete a user credential that does not exist: user {user} "
                              f"({what}) in {store.where}")
    store.alter({}, [(user, m) for m in wanted])
    return f"Completed updating config for user {user}."


def describe(store: CredentialStore, user: str | None) -> list[str]:
    """kafka-configs --describe's lines: mechanisms and iterations, never a secret."""
    users = store.users()
    if user is not None and user not in users:
        raise ScramAdminError(f"Attempt to describe a user credential that does not exist: {user} "
                              f"in {store.where}")
    lines = []
    for name in [user] if user is not None else sorted(users):
        infos = []
        for mech, text in sorted(users[name].items()):
            try:
                infos.append(f"{mech}=iterations={ScramCredential.from_kafka_string(text).iterations}")
            except ValueError:
                infos.append(f"{mech}=unreadable")
        lines.append(f"SCRAM credential configs for user-principal '{name}' are {', '.join(infos)}")
    return lines
