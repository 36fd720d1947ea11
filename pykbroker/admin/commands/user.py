"""``pykbroker user list|create|delete``: SCRAM credentials (DescribeUserScramCredentials,
AlterUserScramCredentials). Passwords are read from a prompt or stdin, never from the command line."""

from __future__ import annotations

import sys
from typing import Any

import click
from confluent_kafka.admin import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from ..describe import MECHANISM_NAMES, describe_scram_users
from ..errors import EXIT_USAGE, AdminError
from ..session import Session, connection_options, partial_failure

MECHANISMS = tuple(MECHANISM_NAMES.values())


@click.group("user")
def user() -> None:
    """SCRAM users (the credentials SASL/SCRAM authenticates against)."""


@user.command("list")
@click.argument("names", nargs=-1)
@connection_options
def list_(names: tuple[str, ...], session: Session) -> None:
    """Users and their mechanisms and iterations (never a password or salt)."""
    described = describe_scram_users(session.wire, list(names) or None)
    errors = {n: d for n, d in described.items() if isinstance(d, AdminError)}
    docs: list[dict[str, Any]] = []
    rows: list[list[Any]] = []
    for n, d in sorted(described.items()):
        if not isinstance(d, AdminError):
            docs.append({"user": n, "credentials": d})
            rows += [[n, c["mechanism"], c["iterations"]] for c in d]
    session.out.emit(docs, ["USER", "MECHANISM", "ITERATIONS"], rows)
    partial_failure(session.out, errors)


@user.command("create")
@click.argument("name")
@click.option("--mechanism", type=click.Choice(MECHANISMS), default="SCRAM-SHA-256", show_default=True)
@click.option("--iterations", type=int, default=8192, show_default=True)
@click.option("--password-stdin", is_flag=True, help="read the password from stdin (for scripts)")
@connection_options
def create(name: str, mechanism: str, iterations: int, password_stdin: bool, session: Session) -> None:
    """Create or replace a user's credentials for one mechanism."""
    password = _password(password_stdin)
    info = ScramCredentialInfo(ScramMechanism[mechanism.replace("-", "_")], iterations)
    _alter(session, [UserScramCredentialUpsertion(name, info, password.encode())], name)
    session.out.emit({"user": name, "mechanism": mechanism, "iterations": iterations, "result": "created"},
                     ["USER", "MECHANISM", "ITERATIONS"], [[name, mechanism, iterations]])


@user.command("delete")
@click.argument("name")
@click.option("--mechanism", "mechanisms", type=click.Choice(MECHANISMS), multiple=True,
              help="delete this mechanism's credentials only (default: every mechanism the user has)")
@connection_options
def delete(name: str, mechanisms: tuple[str, ...], session: Session) -> None:
    """Delete a user's credentials."""
    if not mechanisms:
        described = describe_scram_users(session.wire, [name])[name]
        if isinstance(described, AdminError):
            raise described
        mechanisms = tuple(c["mechanism"] for c in described)
    _alter(session, [UserScramCredentialDeletion(name, ScramMechanism[m.replace("-", "_")]) for m in mechanisms],
           name)
    session.out.emit({"user": name, "deleted": list(mechanisms)}, ["USER", "DELETED"], [[name, list(mechanisms)]])


def _alter(session: Session, alterations: list[Any], name: str) -> None:
    admin = session.admin
    futures = admin.client.alter_user_scram_credentials(alterations, request_timeout=admin.timeout)
    for future in futures.values():
        admin.wait(future, f"alter user {name}")


def _password(from_stdin: bool) -> str:
    if from_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise AdminError("the password is empty", EXIT_USAGE)
    return str(password)


COMMANDS = (user,)
