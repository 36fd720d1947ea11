"""A parser for the JAAS configuration text Kafka takes in ``sasl.jaas.config``.

Grammar (one or more entries): ``<login module class> <flag> [<key>=<value>]... ;`` where the
flag is required, requisite, sufficient or optional and a value is a bare word or a double-quoted
string with backslash escapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
FLAGS = ("required", "requisite", "sufficient", "optional")

_TOKEN = re.compile(r'\s*(?:(?P<quoted>"(?:\\.|[^"\\])*")|(?P<punct>[=;])|(?P<word>[^\s=;"]+))', re.S)


class JaasError(ValueError):
    """The text is not a valid JAAS configuration."""


@dataclass(frozen=True)
class LoginModule:
    class_name: str
    flag: str
    options: dict[str, str] = field(default_factory=dict)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise JaasError(f"unexpected character at offset {pos}")
        pos = m.end()
        if m["quoted"] is not None:
            out.append(("value", re.sub(r"\\(.)", r"\1", m["quoted"][1:-1], flags=re.S)))
        elif m["punct"] is not None:
            out.append((m["punct"], m["punct"]))
        else:
            out.append(("word", m["word"]))
    return out


def parse_jaas(text: str) -> list[LoginModule]:
    """Parse JAAS text into its login modules; raises JaasError (whose message never quotes values)."""
    toks = _tokens(text)
    modules: list[LoginModule] = []
    i = 0
    while i < len(toks):
        kind, cls = toks[i]
        if kind != "word":
            raise JaasError("expected a login module class name")
        if i + 1 >= len(toks) or toks[i + 1][0] != "word" or toks[i + 1][1].lower() not in FLAGS:
            raise JaasError(f"login module {cls} must be followed by one of {', '.join(FLAGS)}")
        flag = toks[i + 1][1].lower()
        i += 2
        options: dict[str, str] = {}
        while i < len(toks) and toks[i][0] != ";":
            if toks[i][0] != "word" or i + 2 >= len(toks) or toks[i + 1][0] != "=" \
                    or toks[i + 2][0] not in ("word", "value"):
                raise JaasError(f"login module {cls}: expected key=value options")
            options[toks[i][1]] = toks[i + 2][1]
            i += 3
        if i >= len(toks):
            raise JaasError(f"login module {cls}: missing the closing ';'")
        i += 1
        modules.append(LoginModule(cls, flag, options))
    if not modules:
        raise JaasError("no login module")
    return modules


def single_module(text: str) -> LoginModule:
    """Kafka's sasl.jaas.config holds exactly one login module."""
    modules = parse_jaas(text)
    if len(modules) != 1:
        raise JaasError(f"must contain exactly one login module, found {len(modules)}")
    return modules[0]


def plain_users(module: LoginModule) -> dict[str, str]:
    """PlainLoginModule's ``user_<name>="<password>"`` options: the users PLAIN accepts."""
    return {k[len("user_"):]: v for k, v in module.options.items() if k.startswith("user_")}
