"""Kafka's ``ssl.principal.mapping.rules``: a client certificate's subject DN -> a principal name.

Rules are tried in order; the first whose pattern matches the whole DN (RFC 2253 form) gives the
name, the ``replacement`` with ``$1``.. group references, optionally lower- (``/L``) or upper-cased
(``/U``).  ``DEFAULT`` gives the DN unchanged.  No rule matching is an error, as in Kafka.
Sans-I/O; the DN string comes from ``dn_from_ssl_subject``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RULE = re.compile(r"\s*((DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?))\s*([,\n]\s*|$)")


class MappingError(ValueError):
    """A rule list that does not parse, or a DN that no rule maps."""


@dataclass(frozen=True, slots=True)
class Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""  # "", "L" or "U"

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        m = self.pattern.fullmatch(dn)
        if m is None:
            return None
        out = _expand(self.replacement, m)
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


def _expand(replacement: str, m: re.Match[str]) -> str:
    """Java's Matcher.replaceAll replacement syntax: $n group references, backslash escapes."""
    out: list[str] = []
    i = 0
    while i < len(replacement):
        c = replacement[i]
        if c == "\\" and i + 1 < len(replacement):
            out.append(replacement[i + 1])
            i += 2
        elif c == "$" and i + 1 < len(replacement) and replacement[i + 1].isdigit():
            j = i + 1
            while j < len(replacement) and replacement[j].isdigit() and int(replacement[i + 1:j + 1]) <= m.re.groups:
                j += 1
            n = int(replacement[i + 1:j]) if j > i + 1 else int(replacement[i + 1])
            if n > m.re.groups:
                raise MappingError(f"no group {n} in pattern {m.re.pattern!r}")
            out.append(m.group(n) or "")
            i = max(j, i + 2)
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_rules(text: str) -> list[Rule]:
    """Parse ``ssl.principal.mapping.rules`` (comma- or newline-separated RULE:... / DEFAULT)."""
    text = text.strip()
    if not text:
        return [Rule(None)]
    rules: list[Rule] = []
    pos = 0
    while pos < len(text):
        m = _RULE.match(text, pos)
        if m is None or m.end() == pos:
            raise MappingError(f"invalid rule at {text[pos:]!r}")
        if m.group(8):
            raise MappingError(f"invalid rule: {m.group(8)!r}")
        if m.group(2):
            rules.append(Rule(None))
        else:
            try:
                pattern = re.compile(m.group(3))
            except re.error as e:
                raise MappingError(f"invalid pattern {m.group(3)!r}: {e}") from None
            rules.append(Rule(pattern, m.group(5), m.group(7) or ""))
        pos = m.end()
    return rules


def map_dn(rules: list[Rule], dn: str) -> str:
    for rule in rules:
        name = rule.apply(dn)
        if name is not None:
            return name
    raise MappingError(f"no ssl.principal.mapping.rules rule matches {dn!r}")


# Attribute type names as Java's X500Principal.getName(RFC2253) prints them; others as OIDs.
_RFC2253_KEYS = {"commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
                 "organizationName": "O", "organizationalUnitName": "OU", "streetAddress": "STREET",
                 "domainComponent": "DC", "userId": "UID"}


def _escape(value: str) -> str:
    out = []
    for i, c in enumerate(value):
        if c in ',+"\\<>;' or (c == "#" and i == 0) or (c == " " and i in (0, len(value) - 1)):
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)


def dn_from_ssl_subject(subject: tuple[tuple[tuple[str, str], ...], ...]) -> str:
    """RFC 2253 DN (most specific RDN first) from ``SSLSocket.getpeercert()['subject']``."""
    rdns = []
    for rdn in reversed(subject):
        rdns.append("+".join(f"{_RFC2253_KEYS.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns)
