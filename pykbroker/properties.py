"""Java properties files (server.properties, a client's command-config): read by the broker's config and by the
admin CLI, so it sits below both and imports nothing of pykbroker."""

from __future__ import annotations

import re


def parse_properties(text: str) -> dict[str, str]:
    """Parse the subset of java.util.Properties syntax that server.properties files use."""
    out: dict[str, str] = {}
    pending = ""
    for raw_line in text.splitlines():
        line = pending + raw_line.lstrip() if pending else raw_line.strip()
        pending = ""
        if not line or line.startswith(("#", "!")):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        m = re.match(r"^((?:\\.|[^=:\s])+)\s*[=:\s]\s*(.*)$", line)
        if m:
            key, value = m.group(1), m.group(2)
        else:
            key, value = line, ""
        out[key.replace("\\", "")] = value.strip()
    return out
