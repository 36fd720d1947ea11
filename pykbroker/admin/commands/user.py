"""``pykbroker user list|create|delete``: SCRAM credentials (DescribeUserScramCredentials,
AlterUserScramCredentials). Passwords are read from a prompt or stdin, never from the command line."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..errors import EXIT_USAGE, AdminError
from ..session import Session, connection_options, partial_failure

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@click.group("user")
def user() -> None:
    """SCRAM users (the credentials SASL/SCRAM authenticates against)."""


@user.command("list")
@click.argument("names", nargs=-1)
@connection_options
def list_(names: tuple[str, ...], session: Session) -> None:
    """Users and their mechanisms and iterations (never a password or salt)."""
    admin = session.admin
    result: Any = admin.client.describe_user_scram_credentials(list(names) or None, request_timeout=admin.timeout)
    if names:
        described = admin.wait_each(result, lambda n: f"describe user {n}")
    else:
        described = admin.wait(result, "describe users")
    described = dict(described)
    errors = {n: d for n, d in described.items() if isinstance(d, AdminError)}
    docs = [{"user": n, "credentials": [{"mechanism": i.mechanism.name.replace("_", "-"),
                                         "iterations": i.iterations} for i in d.scram_credential_infos]}
            for n, d in sorted(described.items()) if not isinstance(d, AdminError)]
    session.out.emit(docs, ["USER", "MECHANISM", "ITERATIONS"],
                     [[d["user"], c["mechanism"], c["iterations"]] for d in docs for c in d["credentials"]])
    partial_failure(session.out, errors)


@user.command("create")
@click.argument("name")
@click.option("--mechanism", type=click.Choice(MECHANISMS), default="SCRAM-SHA-256", show_default=True)
@click.option("--iterations", type=int, default=8192, show_default=True)
@click.option("--password-stdin", is_flag=True, help="read the password from stdin (for scripts)")
@connection_options
def create(name: str, mechanism: str, iterations: int, password_stdin: bool, session: Session) -> None:
    """Create or replace a user's credentials for one mechanism."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

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
    from confluent_kafka.admin import ScramMechanism, UserScramCredentialDeletion

    admin = session.admin
    if not mechanisms:
        futures: Any = admin.client.describe_user_scram_credentials([name], request_timeout=admin.timeout)
        described = admin.wait(futures[name], f"describe user {name}")
        mechanisms = tuple(i.mechanism.name.replace("_", "-") for i in described.scram_credential_infos)
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
