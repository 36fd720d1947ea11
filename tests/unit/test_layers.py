"""The layer order of docs/architecture.md, as the code has it: import-linter's contract (pyproject.toml,
counting imports inside functions and under TYPE_CHECKING) and no import cycle among pykbroker's modules."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def test_layers_contract_is_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert f"{len(contracts)} kept, 0 broken" in done.stdout


def _strongly_connected(graph: grimp.ImportGraph, skip: set[tuple[str, str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the groups of modules that import each other round a cycle."""
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if (m, i) not in skip)
             for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            succ = edges[node]
            if i < len(succ):
                work.append((node, i + 1))
                nxt = succ[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                group = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    group.append(m)
                    if m == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return groups


def test_no_import_cycle() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    ignored = {tuple(x.replace(" ", "").split("->")) for c in config["contracts"] for x in c.get("ignore_imports", [])}
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("pykbroker", exclude_type_checking_imports=False, cache_dir=None)
    cycles = _strongly_connected(graph, {(a, b) for a, b in ignored})
    assert not cycles, f"modules that import each other round a cycle: {cycles}"
