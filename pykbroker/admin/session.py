"""What every admin command shares: its client properties, timeout and output, and the clients it makes from them
(created on first use, closed when the command ends)."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .client import Admin, rdkafka_log
from .errors import EXIT_FAILED, AdminError
from .output import FORMATS, Output
from .settings import client_properties
from .wire import Wire

F = TypeVar("F", bound=Callable[..., Any])


class Session:
    def __init__(self, props: dict[str, str], timeout: float, out: Output) -> None:
        self.props = props
        self.timeout = timeout
        self.out = out
        self._admin: Admin | None = None
        self._wire: Wire | None = None

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.props, self.timeout)
        return self._admin

    @property
    def wire(self) -> Wire:
        """The client for the Admin APIs librdkafka lacks (pykbroker's codec on a socket)."""
        if self._wire is None:
            self._wire = Wire(self.props, self.timeout)
        return self._wire

    def close(self) -> None:
        if self._wire is not None:
            self._wire.close()

    @property
    def bootstrap(self) -> str:
        return self.props["bootstrap.servers"]


def connection_options(f: F) -> F:
    """-b, -X, --command-config, --output, --timeout and --verbose on a command; it receives ``session``."""
    options = [
        click.option("-b", "--bootstrap-server", "bootstrap", metavar="HOST:PORT[,...]",
                     help="brokers to start from (else $PYKBROKER_BOOTSTRAP_SERVERS, the config file, "
                          "127.0.0.1:9092)"),
        click.option("-X", "overrides", multiple=True, metavar="KEY=VALUE",
                     help="a librdkafka property (repeatable): security.protocol, sasl.mechanism, "
                          "sasl.username, ssl.ca.location, ..."),
        click.option("-F", "--command-config", "config_file", metavar="FILE",
                     type=click.Path(dir_okay=False),
                     help="a properties file of librdkafka properties (else $PYKBROKER_CLIENT_CONFIG)"),
        click.option("-o", "--output", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
                     help="aligned tables for people, json for scripts"),
        click.option("--timeout", type=float, default=30.0, show_default=True, metavar="SECONDS",
                     help="how long to wait for the cluster"),
        click.option("-v", "--verbose", is_flag=True, help="show the client library's log lines on stderr"),
    ]

    @functools.wraps(f)
    def wrapper(*args: Any, bootstrap: str | None, overrides: tuple[str, ...], config_file: str | None,
                fmt: str, timeout: float, verbose: bool, **kwargs: Any) -> Any:
        out = Output(fmt)
        _librdkafka_logging(verbose)
        session: Session | None = None
        try:
            session = Session(client_properties(bootstrap, config_file, overrides), timeout, out)
            return f(*args, session=session, **kwargs)
        except AdminError as e:
            fail(out, e)
        finally:
            if session is not None:
                session.close()
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


def fail(out: Output, e: AdminError) -> None:
    """Print the error (as JSON on stdout too, in JSON mode, so that a script sees a document) and exit."""
    if out.json:
        out.emit(e.as_json())
    click.echo(f"error: {e}", err=True)
    sys.exit(e.exit_code)


def partial_failure(out: Output, errors: dict[str, AdminError]) -> None:
    """Some items of a request failed: say which on stderr and exit 1 (the successes are already shown)."""
    if not errors:
        return
    for e in errors.values():
        click.echo(f"error: {e}", err=True)
    sys.exit(EXIT_FAILED)


def _librdkafka_logging(verbose: bool) -> None:
    rdkafka_log.propagate = False
    rdkafka_log.handlers.clear()
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        rdkafka_log.addHandler(handler)
        rdkafka_log.setLevel(logging.DEBUG)
    else:
        rdkafka_log.addHandler(logging.NullHandler())
        rdkafka_log.setLevel(logging.CRITICAL)
