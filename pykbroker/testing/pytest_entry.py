"""The pytest entry point of an installed pykbroker: only the switch that turns the fixtures on.

pytest loads every installed plugin in every test run, so this module adds the ``--pykbroker`` flag and the
``pykbroker`` ini option and nothing else; when either is set it loads ``pykbroker.testing.pytest_plugin``,
the fixtures. A run that sets neither is the same as without pykbroker installed."""

from __future__ import annotations

import pytest

PLUGIN = "pykbroker.testing.pytest_plugin"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pykbroker", "a real pykbroker for the tests (docs/testing.md)")
    group.addoption("--pykbroker", action="store_true", default=False,
                    help=f"enable pykbroker's fixtures (the same as -p {PLUGIN})")
    parser.addini("pykbroker", type="bool", default=False,
                  help=f"enable pykbroker's fixtures (the same as -p {PLUGIN})")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("pykbroker") or config.getini("pykbroker"):
        config.pluginmanager.import_plugin(PLUGIN)  # no-op when already loaded with -p
