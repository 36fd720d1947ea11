"""``pykbroker quota list|set``: client quotas of users, client ids and IPs (DescribeClientQuotas,
AlterClientQuotas), which librdkafka's AdminClient cannot ask for."""

from __future__ import annotations

from typing import Any

import click

from ..connection import check
from ..errors import EXIT_USAGE, AdminError
from ..session import Session, connection_options
from .common import key_values

DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49
EXACT, DEFAULT = 0, 1  # DescribeClientQuotas' match types
KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate",
        "connection_creation_rate")
ENTITY_TYPES = ("user", "client-id", "ip")


def _entity_doc(entity: Any) -> dict[str, str | None]:
    """An entity as {type: name}, None for the type's default entity, in a fixed type order."""
    named = {str(e.entity_type): e.entity_name for e in entity}
    return {t: named[t] for t in ENTITY_TYPES if t in named}


def _entity_text(entity: dict[str, str | None]) -> str:
    return ",".join(f"{t}={'<default>' if n is None else n}" for t, n in entity.items())


def _entity_options(f: Any) -> Any:
    for option in reversed([
        click.option("--user", help="a user principal's name"),
        click.option("--client-id", help="a client id"),
        click.option("--ip", help="a client IP address (connection_creation_rate only)"),
        click.option("--default-user", is_flag=True, help="the default of every user"),
        click.option("--default-client-id", is_flag=True, help="the default of every client id"),
        click.option("--default-ip", is_flag=True, help="the default of every IP address"),
    ]):
        f = option(f)
    return f


def _entity(user: str | None, client_id: str | None, ip: str | None, default_user: bool,
            default_client_id: bool, default_ip: bool) -> list[tuple[str, str | None, bool]]:
    """(type, name, is default) of each part of the entity the options name."""
    parts: list[tuple[str, str | None, bool]] = []
    for etype, name, default in (("user", user, default_user), ("client-id", client_id, default_client_id),
                                 ("ip", ip, default_ip)):
        if name is not None and default:
            raise AdminError(f"--{etype} and --default-{etype} name different entities: give one", EXIT_USAGE)
        if name is not None or default:
            parts.append((etype, name, default))
    return parts


@click.group("quota")
def quota() -> None:
    """Client quotas (byte rates, request time, controller mutations, connection rates)."""


@quota.command("list")
@_entity_options
@click.option("--strict", is_flag=True, help="only entities of exactly the given types (kafka-configs' default "
                                              "is every entity that includes them)")
@connection_options
def list_(user: str | None, client_id: str | None, ip: str | None, default_user: bool, default_client_id: bool,
          default_ip: bool, strict: bool, session: Session) -> None:
    """Quotas of every entity, or of those matching the options."""
    parts = _entity(user, client_id, ip, default_user, default_client_id, default_ip)
    components = [{"entity_type": t, "match_type": DEFAULT if d else EXACT, "match": None if d else n}
                  for t, n, d in parts]
    _, response = session.wire.any().request(DESCRIBE_CLIENT_QUOTAS, {"components": components, "strict": strict})
    check(response.error_code, "DescribeClientQuotas", response.error_message)
    docs: list[dict[str, Any]] = [{"entity": _entity_doc(e.entity), "quotas": {str(v.key): float(v.value)
                                                          for v in sorted(e.values, key=lambda v: str(v.key))}}
            for e in response.entries]
    docs.sort(key=lambda d: _entity_text(d["entity"]))
    session.out.emit(docs, ["ENTITY", "QUOTA", "VALUE"],
                     [[_entity_text(d["entity"]), k, _number(v)] for d in docs for k, v in d["quotas"].items()])


@quota.command("set")
@_entity_options
@click.argument("pairs", nargs=-1, metavar="KEY=VALUE...")
@click.option("--delete", "deletes", multiple=True, metavar="KEY", help="remove a quota (repeatable)")
@click.option("--validate-only", is_flag=True, help="ask the cluster to check the change without making it")
@connection_options
def set_(user: str | None, client_id: str | None, ip: str | None, default_user: bool, default_client_id: bool,
         default_ip: bool, pairs: tuple[str, ...], deletes: tuple[str, ...], validate_only: bool,
         session: Session) -> None:
    """Set quotas of one entity (KEY is producer_byte_rate, consumer_byte_rate, request_percentage,
    controller_mutation_rate or connection_creation_rate) and remove others with --delete."""
    parts = _entity(user, client_id, ip, default_user, default_client_id, default_ip)
    if not parts:
        raise AdminError("name the entity: --user, --client-id, --ip or a --default-... option", EXIT_USAGE)
    sets: dict[str, float] = {}
    for key, value in key_values(pairs, "quota set").items():
        try:
            sets[key] = float(value)
        except ValueError as e:
            raise AdminError(f"the quota {key} takes a number, not {value!r}", EXIT_USAGE) from e
    if not sets and not deletes:
        raise AdminError("nothing to change: give KEY=VALUE to set or --delete KEY", EXIT_USAGE)
    entity = [{"entity_type": t, "entity_name": n} for t, n, _ in parts]
    ops = [{"key": k, "value": v, "remove": False} for k, v in sets.items()]
    ops += [{"key": k, "value": 0.0, "remove": True} for k in deletes]
    body = {"entries": [{"entity": entity, "ops": ops}], "validate_only": validate_only}
    _, response = session.wire.any().request(ALTER_CLIENT_QUOTAS, body)
    entity_doc = {t: n for t, n, _ in parts}
    for entry in response.entries:
        check(entry.error_code, f"AlterClientQuotas {_entity_text(entity_doc)}", entry.error_message)
    changes: list[dict[str, Any]] = [{"key": k, "operation": "set", "value": v} for k, v in sets.items()]
    changes += [{"key": k, "operation": "delete", "value": None} for k in deletes]
    session.out.emit({"entity": entity_doc, "changes": changes, "validate_only": validate_only},
                     ["ENTITY", "QUOTA", "OPERATION", "VALUE"],
                     [[_entity_text(entity_doc), c["key"], c["operation"], _number(c["value"])] for c in changes])


def _number(value: float | None) -> Any:
    """1048576.0 shown as 1048576: most quotas are whole numbers."""
    return int(value) if value is not None and value.is_integer() else value


COMMANDS = (quota,)
