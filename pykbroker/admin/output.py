"""How results are shown: aligned tables for people, ``--output json`` for scripts (one JSON document on
stdout, keys in a fixed order), messages and progress on stderr so that stdout stays parseable."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

FORMATS = ("table", "json")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value) if value else "-"
    return str(value)


class Output:
    """Where a command writes: ``emit`` gives the JSON document or the table of the same result."""

    def __init__(self, fmt: str = "table", stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self.format = fmt
        self._stdout = stdout or sys.stdout
        self._stderr = stderr or sys.stderr
        tty = self._stdout.isatty()
        # Piped tables are not wrapped or cut: a script's grep or awk must see whole rows.
        self._console = Console(file=self._stdout, width=None if tty else 100_000, highlight=False,
                                soft_wrap=not tty, no_color=not tty)
        self._err = Console(file=self._stderr, highlight=False, no_color=not self._stderr.isatty())

    @property
    def json(self) -> bool:
        return self.format == "json"

    def emit(self, document: Any, columns: Sequence[str] = (), rows: Sequence[Sequence[Any]] = (),
             title: str | None = None) -> None:
        """The result: ``document`` as JSON, else ``rows`` as a table under ``columns``."""
        if self.json:
            self._stdout.write(json.dumps(document, indent=2, default=str) + "\n")
            self._stdout.flush()
        else:
            self.table(columns, rows, title)

    def table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
        if title:
            self._console.print(title, markup=False)
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
        for c in columns:
            t.add_column(c, overflow="fold")
        for r in rows:
            t.add_row(*(_cell(v) for v in r))
        self._console.print(t)

    def fields(self, pairs: Sequence[tuple[str, Any]], title: str | None = None) -> None:
        """One record as aligned ``name  value`` lines (a describe's header)."""
        if title:
            self._console.print(title, markup=False)
        width = max((len(k) for k, _ in pairs), default=0)
        for k, v in pairs:
            self._console.print(f"{k.ljust(width)}  {_cell(v)}", markup=False)

    def line(self, text: str) -> None:
        """A line of a table-mode result (nothing in JSON mode, where ``emit`` says everything)."""
        if not self.json:
            self._console.print(text, markup=False)

    def note(self, text: str) -> None:
        """Something for the person, never for the parser: stderr."""
        self._err.print(text, markup=False)

    @contextmanager
    def progress(self, description: str, total: int | None) -> Iterator[Any]:
        """A progress bar on stderr when it is a terminal; otherwise a silent stand-in with the same ``advance``."""
        if not self._stderr.isatty():
            yield _Silent()
            return
        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        with Progress(*columns, console=self._err, transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield _Task(bar, task)


class _Silent:
    def advance(self, n: int = 1) -> None:
        pass

    def update(self, completed: int, total: int | None = None) -> None:
        pass


class _Task:
    def __init__(self, bar: Progress, task: Any) -> None:
        self._bar, self._task = bar, task

    def advance(self, n: int = 1) -> None:
        self._bar.advance(self._task, n)

    def update(self, completed: int, total: int | None = None) -> None:
        self._bar.update(self._task, completed=completed, total=total)
