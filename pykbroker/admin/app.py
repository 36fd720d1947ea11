"""The admin commands as one click app; ``pykbroker.cli`` hands it every command line whose first word is one
of ``pykbroker.admin.COMMANDS``."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

from pykbroker import __version__
from pykbroker.admin import COMPLETE_VAR

from .commands import acl, cluster, config, group, partition, quota, records, share_group, topic, txn, user


@click.group(name="pykbroker", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="pykbroker")
def root() -> None:
    """Inspect and change a Kafka cluster (pykbroker or Apache Kafka) over the Admin API.

    Connection settings are librdkafka properties: -b, -X key=value, -F file, or $PYKBROKER_BOOTSTRAP_SERVERS and
    $PYKBROKER_CLIENT_CONFIG. Exit codes: 0 done, 1 the cluster refused or an item failed, 2 usage, 3 the
    cluster was not reached in time."""


@root.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script, for example: eval "$(pykbroker completion bash)"."""
    cls = get_completion_class(shell)
    assert cls is not None
    click.echo(cls(root, {}, "pykbroker", COMPLETE_VAR).source())


# Each module of pykbroker.admin.commands exports COMMANDS: the click commands it adds to the root.
for _module in (cluster, topic, group, share_group, records, config, acl, user, quota, partition, txn):
    for _command in _module.COMMANDS:
        root.add_command(_command)


def main(argv: list[str]) -> int:
    """Run one admin command line; its exit code."""
    try:
        root.main(args=argv, prog_name="pykbroker", complete_var=COMPLETE_VAR, standalone_mode=True)
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return 0
