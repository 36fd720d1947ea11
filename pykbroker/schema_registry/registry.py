"""The schema registry's state, sans I/O: what the records of ``_schemas`` say, applied in offset order, the
answers to queries, and the plans of writes (the records to append, and the answer once they are committed).

Nothing here waits or touches the network or disk: the broker edge (service.py) replays the partition into a
:class:`Registry`, appends a plan's records as the writer and applies them; unit tests drive it with plain
calls. Semantics are Confluent Schema Registry's (its REST API reference is the spec): one id per distinct
schema (type, canonical text and references) across subjects, versions numbered per subject and never reused
while a soft-deleted version keeps its number, soft deletes before permanent ones, and so on."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import errors as e
from .serde import (
    CLEAR_SUBJECT,
    CONFIG,
    DELETE_SUBJECT,
    MODE,
    SCHEMA,
    ConfigValue,
    DeleteSubjectValue,
    Reference,
    SchemaValue,
    SerdeError,
    config_record,
    decode_record,
    encode_schema_value,
    mode_record,
    schema_key,
)

log = logging.getLogger("pykbroker.schema_registry")

COMPATIBILITY_LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
                        "FULL_TRANSITIVE")
MODES = ("READWRITE", "READONLY", "IMPORT")
MAX_VERSION = (1 << 31) - 1
MAX_REFERENCE_DEPTH = 64  # nested references resolved at most this deep (a cycle is refused, not followed)

KV = tuple[bytes, bytes | None]


class ParsedSchema(Protocol):
    """What the formats (pykbroker/schema_registry/formats) give back for a schema text."""

    schema_type: str

    def canonical(self) -> str: ...

    def normalized(self) -> str: ...

    def formatted(self, fmt: str) -> str: ...


@dataclass(frozen=True)
class Formats:
    """The schema formats the registry parses and checks with (AVRO, PROTOBUF, JSON): passed in so that this
    module depends on their interface only."""

    parse: Callable[[str, str, Mapping[str, str]], ParsedSchema]
    check_compatibility: Callable[[str, ParsedSchema, Sequence[ParsedSchema]], list[str]]
    schema_types: tuple[str, ...]
    invalid_schema: type[Exception]


def default_formats() -> Formats:
    # Imported when a registry starts: fastavro, protobuf and jsonschema would cost a broker without one
    # about 0.7 s at start.
    from . import formats

    return Formats(parse=formats.parse, check_compatibility=formats.check_compatibility,
                   schema_types=tuple(formats.SCHEMA_TYPES), invalid_schema=formats.InvalidSchema)


SchemaKey = tuple[str, str, tuple[Reference, ...]]  # (schema type, text, references): one id each


@dataclass(slots=True)
class Version:
    subject: str
    version: int
    id: int
    schema_type: str
    schema: str
    references: tuple[Reference, ...]
    deleted: bool

    @property
    def key(self) -> SchemaKey:
        return (self.schema_type, self.schema, self.references)


@dataclass
class Write:
    """A planned write: the records to append to ``_schemas`` (none when nothing changes) and the JSON answer
    to give once they are committed."""

    records: list[KV]
    result: Any


@dataclass
class _Candidate:
    parsed: ParsedSchema
    schema_type: str
    text: str
    references: tuple[Reference, ...]

    @property
    def key(self) -> SchemaKey:
        return (self.schema_type, self.text, self.references)


def _flag(value: object) -> bool:
    """A boolean query parameter as clients send it (``true``, ``True``: the Python client formats bools)."""
    return str(value).strip().lower() == "true"


def _page(items: list[Any], offset: int, limit: int) -> list[Any]:
    items = items[max(0, offset):]
    return items[:limit] if limit > 0 else items


def _schema_json(v: Version | None, schema_type: str, text: str, references: tuple[Reference, ...]
                 ) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if v is not None:
        doc.update(subject=v.subject, version=v.version, id=v.id)
    if schema_type != "AVRO":
        doc["schemaType"] = schema_type
    if references:
        doc["references"] = [r.to_json() for r in references]
    doc["schema"] = text
    return doc


@dataclass
class Registry:
    """The state of one registry: built by applying ``_schemas`` records in offset order."""

    default_compatibility: str = "BACKWARD"
    formats: Formats = field(default_factory=default_formats)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything (a replay from the start follows)."""
        self.subjects: dict[str, dict[int, Version]] = {}
        self.ids: dict[int, SchemaKey] = {}
        self.by_key: dict[SchemaKey, int] = {}
        # The versions (soft-deleted included) naming each id: a lookup by id reads them, not every version.
        self._by_id: dict[int, dict[tuple[str, int], Version]] = {}
        self.max_id = 0  # the highest id ever seen, hard-deleted ones included: never handed out again
        self.configs: dict[str | None, ConfigValue] = {}
        self.modes: dict[str | None, str] = {}
        self.next_offset = 0  # the offset of the next record to apply
        self._parsed: dict[int, ParsedSchema] = {}

    # --- applying records ---------------------------------------------------------------------------------

    def apply(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        """Apply the record at ``offset`` (records come in offset order; compaction leaves gaps). A record
        this registry cannot read is skipped with a log line: one bad record must not stop the registry."""
        self.next_offset = max(self.next_offset, offset + 1)
        try:
            rec = decode_record(key, value)
        except SerdeError as exc:
            log.warning("skipping unreadable _schemas record at offset %(offset)d: %(error)s",
                        {"offset": offset, "error": exc})
            return
        k = rec.key
        if k.keytype == SCHEMA:
            assert k.subject is not None and k.version is not None
            if rec.value is None:
                self._drop_version(k.subject, k.version)
            else:
                self._put_version(rec.value)
        elif k.keytype == CONFIG:
            if rec.value is None or rec.value.compatibility_level is None:
                self.configs.pop(k.subject, None)
            else:
                self.configs[k.subject] = rec.value
        elif k.keytype == MODE:
            if rec.value is None:
                self.modes.pop(k.subject, None)
            else:
                self.modes[k.subject] = rec.value
        elif k.keytype == DELETE_SUBJECT and isinstance(rec.value, DeleteSubjectValue):
            for v in self.subjects.get(rec.value.subject, {}).values():
                if v.version <= rec.value.version:
                    v.deleted = True
        elif k.keytype == CLEAR_SUBJECT and k.subject is not None:
            for v in [v for v in self.subjects.get(k.subject, {}).values() if v.deleted]:
                self._drop_version(v.subject, v.version)

    def _put_version(self, sv: SchemaValue) -> None:
        if sv.id <= 0 or not 0 < sv.version <= MAX_VERSION:
            log.warning("skipping _schemas record of %(subject)s version %(version)d with id %(id)d: out of range",
                        {"subject": sv.subject, "version": sv.version, "id": sv.id})
            return
        self._drop_version(sv.subject, sv.version)
        v = Version(sv.subject, sv.version, sv.id, sv.schema_type, sv.schema, sv.references, sv.deleted)
        self.subjects.setdefault(sv.subject, {})[sv.version] = v
        known = self.ids.get(sv.id)
        if known is None:
            self.ids[sv.id] = v.key
        elif known != v.key:
            log.warning("_schemas names id %(id)d for two different schemas; keeping the first",
                        {"id": sv.id, "subject": sv.subject, "version": sv.version})
        self.by_key.setdefault(v.key, sv.id)
        self._by_id.setdefault(sv.id, {})[(sv.subject, sv.version)] = v
        self.max_id = max(self.max_id, sv.id)

    def _drop_version(self, subject: str, version: int) -> None:
        versions = self.subjects.get(subject)
        if versions is None or version not in versions:
            return
        v = versions.pop(version)
        if not versions:
            del self.subjects[subject]
        users = self._by_id.get(v.id, {})
        users.pop((subject, version), None)
        if users:
            return
        self._by_id.pop(v.id, None)
        key = self.ids.pop(v.id, None)
        if key is not None and self.by_key.get(key) == v.id:
            del self.by_key[key]
        self._parsed.pop(v.id, None)

    # --- helpers ------------------------------------------------------------------------------------------

    def _versions(self, subject: str, *, deleted: bool = False) -> list[Version]:
        return sorted((v for v in self.subjects.get(subject, {}).values() if deleted or not v.deleted),
                      key=lambda v: v.version)

    def _live_subject(self, subject: str) -> list[Version]:
        versions = self._versions(subject)
        if not versions:
            raise e.subject_not_found(subject)
        return versions

    @staticmethod
    def parse_version(text: str | int) -> int | None:
        """A version path segment: None for ``latest`` (or -1), else 1..2^31-1; 42202 otherwise."""
        s = str(text).strip()
        if s.lower() == "latest" or s == "-1":
            return None
        try:
            n = int(s)
        except ValueError:
            raise e.invalid_version(text) from None
        if not 0 < n <= MAX_VERSION:
            raise e.invalid_version(text)
        return n

    def _find_version(self, subject: str, version: str | int, *, deleted: bool) -> Version:
        versions = self._versions(subject, deleted=deleted)
        n = self.parse_version(version)
        if not versions:
            raise e.subject_not_found(subject)
        if n is None:
            return versions[-1]
        for v in versions:
            if v.version == n:
                return v
        raise e.version_not_found(subject, n)

    def compatibility(self, subject: str | None) -> str:
        cfg = self.configs.get(subject) if subject is not None else None
        if cfg is not None and cfg.compatibility_level:
            return cfg.compatibility_level
        glob = self.configs.get(None)
        return glob.compatibility_level if glob is not None and glob.compatibility_level else \
            self.default_compatibility

    def _normalize_default(self, subject: str) -> bool:
        for cfg in (self.configs.get(subject), self.configs.get(None)):
            if cfg is not None and cfg.normalize is not None:
                return cfg.normalize
        return False

    def mode(self, subject: str | None) -> str:
        if subject is not None and subject in self.modes:
            return self.modes[subject]
        return self.modes.get(None, "READWRITE")

    def _resolve(self, refs: Sequence[Reference], depth: int = 0, seen: frozenset[tuple[str, int]] = frozenset()
                 ) -> tuple[tuple[Reference, ...], dict[str, str]]:
        """The references with ``-1`` versions made concrete, and every name they bring in (transitively)
        mapped to its schema text."""
        if depth > MAX_REFERENCE_DEPTH:
            raise e.invalid_schema(f"Invalid schema: references nest deeper than {MAX_REFERENCE_DEPTH}")
        resolved: list[Reference] = []
        texts: dict[str, str] = {}
        for r in refs:
            versions = self._versions(r.subject, deleted=True)
            target = None
            if r.version == -1:
                live = [v for v in versions if not v.deleted]
                target = live[-1] if live else None
            else:
                target = next((v for v in versions if v.version == r.version), None)
            if target is None:
                raise e.invalid_schema(f"Invalid schema reference {r.name}: subject '{r.subject}' version "
                                       f"{r.version} not found")
            if (target.subject, target.version) in seen:
                raise e.invalid_schema(f"Invalid schema reference {r.name}: a cycle through subject "
                                       f"'{target.subject}' version {target.version}")
            _, nested = self._resolve(target.references, depth + 1, seen | {(target.subject, target.version)})
            texts.update(nested)
            texts[r.name] = target.schema
            resolved.append(Reference(r.name, target.subject, target.version))
        return tuple(resolved), texts

    def _parse(self, schema_type: str, text: str, references: Sequence[Reference]
               ) -> tuple[ParsedSchema, tuple[Reference, ...]]:
        resolved, texts = self._resolve(references)
        try:
            return self.formats.parse(schema_type, text, texts), resolved
        except self.formats.invalid_schema as exc:
            raise e.invalid_schema(f"Invalid schema: {exc}") from None
        except Exception as exc:  # a parser library's own exception: still the schema's fault, said in one line
            log.info("%(schema_type)s schema parser failed: %(error)r", {"schema_type": schema_type, "error": exc})
            raise e.invalid_schema(f"Invalid schema: {exc}") from None

    def parsed(self, v: Version) -> ParsedSchema:
        """The stored schema parsed (cached per id): for compatibility checks and ``format=``."""
        p = self._parsed.get(v.id)
        if p is None:
            p, _ = self._parse(v.schema_type, v.schema, v.references)
            self._parsed[v.id] = p
        return p

    def _candidate(self, body: Any, *, normalize: bool) -> _Candidate:
        """A schema from a request body ({"schema", "schemaType", "references"}), parsed."""
        if not isinstance(body, dict):
            raise e.RegistryError(422, 422, "The request body must be a JSON object")
        text = body.get("schema")
        if text is not None and not isinstance(text, str):  # Confluent's answer to a body it cannot map
            raise e.RegistryError(400, 400, "The schema must be given as a JSON string (the schema's text), not "
                                            f"as a JSON {type(text).__name__}")
        if not isinstance(text, str) or not text.strip():
            raise e.invalid_schema("Empty schema")
        schema_type = body.get("schemaType") or "AVRO"
        if not isinstance(schema_type, str) or schema_type.upper() not in self.formats.schema_types:
            raise e.invalid_schema(f"Invalid schema type {schema_type!r}: expected one of "
                                   f"{', '.join(self.formats.schema_types)}")
        schema_type = schema_type.upper()
        for unsupported in ("metadata", "ruleSet"):
            if body.get(unsupported) not in (None, {}, []):
                raise e.invalid_schema(f"Schema {unsupported} (data contracts) is not supported by this registry")
        refs_doc = body.get("references") or []
        if not isinstance(refs_doc, list):
            raise e.invalid_schema("references must be a list")
        refs: list[Reference] = []
        for r in refs_doc:
            if (not isinstance(r, dict) or not isinstance(r.get("name"), str) or not isinstance(r.get("subject"), str)
                    or not isinstance(r.get("version"), int) or isinstance(r.get("version"), bool)):
                raise e.invalid_schema(f"Invalid schema reference {r!r}: needs name, subject and version")
            refs.append(Reference(r["name"], r["subject"], r["version"]))
        parsed, resolved = self._parse(schema_type, text, refs)
        try:
            out = parsed.normalized() if normalize else parsed.canonical()
        except Exception as exc:  # as in _parse
            raise e.invalid_schema(f"Invalid schema: {exc}") from None
        return _Candidate(parsed, schema_type, out, resolved)

    def _formatted(self, v: Version, fmt: str) -> str:
        if not fmt:
            return v.schema
        try:
            return self.parsed(v).formatted(fmt)
        except Exception:  # a format this schema type has not: the schema as stored, as Confluent
            return v.schema

    def version_json(self, v: Version, fmt: str = "") -> dict[str, Any]:
        return _schema_json(v, v.schema_type, self._formatted(v, fmt), v.references)

    def _check(self, level: str, new: ParsedSchema, previous: list[Version]) -> list[str]:
        if level == "NONE" or not previous:
            return []
        older = [self.parsed(v) for v in previous]
        try:
            return self.formats.check_compatibility(level, new, older)
        except Exception as exc:  # the checker could not decide: refuse, saying why, rather than answer 500
            log.info("compatibility check failed: %(error)r", {"error": exc})
            return [f"The compatibility check failed: {exc}"]

    # --- queries ------------------------------------------------------------------------------------------

    def list_subjects(self, *, deleted: bool = False, deleted_only: bool = False, prefix: str = "") -> list[str]:
        out = []
        for s, versions in self.subjects.items():
            if not s.startswith(prefix):
                continue
            live = any(not v.deleted for v in versions.values())
            if deleted_only:
                if any(v.deleted for v in versions.values()):
                    out.append(s)
            elif live or deleted:
                out.append(s)
        return sorted(out)

    def list_versions(self, subject: str, *, deleted: bool = False, deleted_only: bool = False) -> list[int]:
        versions = self._versions(subject, deleted=deleted or deleted_only)
        if not versions:
            raise e.subject_not_found(subject)
        return [v.version for v in versions if not deleted_only or v.deleted]

    def get_version(self, subject: str, version: str | int, *, deleted: bool = False, fmt: str = ""
                    ) -> dict[str, Any]:
        return self.version_json(self._find_version(subject, version, deleted=deleted), fmt)

    def get_version_schema(self, subject: str, version: str | int, *, deleted: bool = False, fmt: str = "") -> str:
        return self._formatted(self._find_version(subject, version, deleted=deleted), fmt)

    def referenced_by(self, subject: str, version: str | int) -> list[int]:
        v = self._find_version(subject, version, deleted=True)
        return self._referencing_ids(v)

    def _referencing_ids(self, target: Version) -> list[int]:
        ids = {v.id for versions in self.subjects.values() for v in versions.values()
               if not v.deleted and any(r.subject == target.subject and r.version == target.version
                                        for r in v.references)}
        return sorted(ids)

    def _versions_with_id(self, schema_id: int, *, deleted: bool) -> list[Version]:
        return sorted((v for v in self._by_id.get(schema_id, {}).values() if deleted or not v.deleted),
                      key=lambda v: (v.subject, v.version))

    def _any_version_with_id(self, schema_id: int) -> Version:
        versions = self._versions_with_id(schema_id, deleted=True)
        if schema_id not in self.ids or not versions:
            raise e.schema_not_found(f"Schema {schema_id} not found")
        live = [v for v in versions if not v.deleted]
        return (live or versions)[0]

    def schema_by_id(self, schema_id: int, *, fmt: str = "") -> dict[str, Any]:
        v = self._any_version_with_id(schema_id)
        return _schema_json(None, v.schema_type, self._formatted(v, fmt), v.references)

    def schema_text_by_id(self, schema_id: int, *, fmt: str = "") -> str:
        return self._formatted(self._any_version_with_id(schema_id), fmt)

    def subjects_of_id(self, schema_id: int, *, subject: str | None = None, deleted: bool = False) -> list[str]:
        self._any_version_with_id(schema_id)
        return sorted({v.subject for v in self._versions_with_id(schema_id, deleted=deleted)
                       if subject is None or v.subject == subject})

    def versions_of_id(self, schema_id: int, *, subject: str | None = None, deleted: bool = False
                       ) -> list[dict[str, Any]]:
        self._any_version_with_id(schema_id)
        return [{"subject": v.subject, "version": v.version}
                for v in self._versions_with_id(schema_id, deleted=deleted) if subject is None or v.subject == subject]

    def list_schemas(self, *, prefix: str = "", deleted: bool = False, latest_only: bool = False
                     ) -> list[dict[str, Any]]:
        out = []
        for s in sorted(self.subjects):
            if not s.startswith(prefix):
                continue
            versions = self._versions(s, deleted=deleted)
            for v in versions[-1:] if latest_only else versions:
                out.append(self.version_json(v))
        return out

    def lookup(self, subject: str, body: Any, *, normalize: bool = False, deleted: bool = False
               ) -> dict[str, Any]:
        """``POST /subjects/{subject}``: the version of this subject holding this schema."""
        if not self._versions(subject, deleted=deleted):
            raise e.subject_not_found(subject)
        cand = self._candidate(body, normalize=normalize or self._normalize_default(subject))
        keys = {cand.key}
        if not normalize:  # as Confluent: a schema registered normalized is found by its normalized form too
            try:
                keys.add((cand.schema_type, cand.parsed.normalized(), cand.references))
            except Exception:  # no normalized form: the canonical one only
                pass
        for v in reversed(self._versions(subject, deleted=deleted)):
            if v.key in keys:
                return self.version_json(v)
        raise e.schema_not_found()

    def get_config(self, subject: str | None, *, default_to_global: bool = False) -> dict[str, Any]:
        cfg = self.configs.get(subject) if subject is not None else None
        if subject is not None and cfg is None and not default_to_global:
            raise e.RegistryError(404, e.SUBJECT_COMPATIBILITY_NOT_CONFIGURED,
                                  f"Subject '{subject}' does not have subject-level compatibility configured")
        doc: dict[str, Any] = {"compatibilityLevel": self.compatibility(subject)}
        used = cfg if cfg is not None else self.configs.get(None)
        if used is not None and used.normalize is not None:
            doc["normalize"] = used.normalize
        return doc

    def get_mode(self, subject: str | None, *, default_to_global: bool = False) -> dict[str, Any]:
        if subject is not None and subject not in self.modes and not default_to_global:
            raise e.RegistryError(404, e.SUBJECT_MODE_NOT_CONFIGURED,
                                  f"Subject '{subject}' does not have subject-level mode configured")
        return {"mode": self.mode(subject)}

    def check_compatibility(self, subject: str, version: str | int | None, body: Any, *, normalize: bool = False,
                            verbose: bool = False) -> dict[str, Any]:
        """``POST /compatibility/subjects/{subject}/versions[/{version}]``: ``version`` None tests against the
        versions the subject's level names (all of them for a transitive level)."""
        n = None if version is None else self.parse_version(version)
        cand = self._candidate(body, normalize=normalize)
        level = self.compatibility(subject)
        live = self._versions(subject)
        if version is None or n is None:
            previous = live
        else:
            if not live and not self._versions(subject, deleted=True):
                raise e.subject_not_found(subject)
            previous = [self._find_version(subject, n, deleted=False)]
            level = level.removesuffix("_TRANSITIVE")
        messages = self._check(level, cand.parsed, previous)
        doc: dict[str, Any] = {"is_compatible": not messages}
        if verbose:
            doc["messages"] = messages
        return doc

    # --- writes (plans) -----------------------------------------------------------------------------------

    def _writable(self, subject: str | None) -> None:
        if self.mode(subject) == "READONLY":
            where = f"Subject {subject}" if subject is not None else "The registry"
            raise e.not_permitted(f"{where} is in read-only mode")

    def plan_register(self, subject: str, body: Any, *, normalize: bool = False) -> Write:
        """``POST /subjects/{subject}/versions``: the id of the schema under this subject, registering it as
        the subject's next version when it is not its live version already (refused when incompatible)."""
        self._writable(subject)
        mode = self.mode(subject)
        if not isinstance(body, dict):
            raise e.RegistryError(422, 422, "The request body must be a JSON object")
        want_id, want_version = body.get("id"), body.get("version")
        for name, value in (("id", want_id), ("version", want_version)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise e.RegistryError(422, 422, f"{name} must be an integer")
        if want_id is not None and want_id < 0:
            want_id = None  # -1: none given, as the clients send it
        if want_version is not None and want_version <= 0:
            want_version = None
        if want_id is not None and mode != "IMPORT":
            raise e.not_permitted(f"Subject {subject} is not in import mode: a schema cannot be registered with "
                                  "an id of its own")
        cand = self._candidate(body, normalize=normalize or self._normalize_default(subject))
        live = self._versions(subject)
        for v in reversed(live):
            if v.key == cand.key and (want_id is None or want_id == v.id):
                return Write([], {"id": v.id})
        if mode != "IMPORT":
            messages = self._check(self.compatibility(subject), cand.parsed, live)
            if messages:
                raise e.RegistryError(409, e.INCOMPATIBLE_SCHEMA,
                                      f"Schema being registered is incompatible with an earlier schema for subject "
                                      f"\"{subject}\", details: [{', '.join(messages)}]")
        if want_id is not None:
            known = self.ids.get(want_id)
            if known is not None and known != cand.key:
                raise e.not_permitted(f"Overwrite new schema with id {want_id} is not permitted.")
            schema_id = want_id
        else:
            schema_id = self.by_key.get(cand.key) or self.max_id + 1
        every = self.subjects.get(subject, {})
        if want_version is not None:
            if want_version in every:
                raise e.not_permitted(f"Version {want_version} of subject {subject} already exists")
            version = want_version
        else:
            version = max(every, default=0) + 1
        if version > MAX_VERSION:
            raise e.invalid_version(version)
        value = SchemaValue(subject, version, schema_id, cand.text, cand.schema_type, cand.references, False)
        return Write([(schema_key(subject, version), encode_schema_value(value))], {"id": schema_id})

    def _refuse_referenced(self, v: Version) -> None:
        ids = self._referencing_ids(v)
        if ids:
            raise e.RegistryError(422, e.REFERENCE_EXISTS,
                                  f"One or more references exist to the schema {{subject={v.subject}, "
                                  f"version={v.version}}}: schema ids {ids}")

    def plan_delete_subject(self, subject: str, *, permanent: bool = False) -> Write:
        every = self._versions(subject, deleted=True)
        if not every:
            raise e.subject_not_found(subject)
        self._writable(subject)
        live = [v for v in every if not v.deleted]
        if permanent:
            if live:
                raise e.RegistryError(404, e.SUBJECT_NOT_SOFT_DELETED,
                                      f"Subject '{subject}' was not deleted first before being permanently deleted")
            for v in every:
                self._refuse_referenced(v)
            return Write([(schema_key(subject, v.version), None) for v in every], [v.version for v in every])
        if not live:
            raise e.RegistryError(404, e.SUBJECT_SOFT_DELETED,
                                  f"Subject '{subject}' was soft deleted. Set permanent=true to delete permanently")
        for v in live:
            self._refuse_referenced(v)
        return Write([self._soft_deleted(v) for v in live], [v.version for v in live])

    @staticmethod
    def _soft_deleted(v: Version) -> KV:
        value = SchemaValue(v.subject, v.version, v.id, v.schema, v.schema_type, v.references, True)
        return schema_key(v.subject, v.version), encode_schema_value(value)

    def plan_delete_version(self, subject: str, version: str | int, *, permanent: bool = False) -> Write:
        n = self.parse_version(version)
        if not self._versions(subject, deleted=True):
            raise e.subject_not_found(subject)
        self._writable(subject)
        if n is None:
            v = self._find_version(subject, "latest", deleted=permanent)
        else:
            found = self.subjects.get(subject, {}).get(n)
            if found is None:
                raise e.version_not_found(subject, n)
            v = found
        if permanent:
            if not v.deleted:
                raise e.RegistryError(404, e.VERSION_NOT_SOFT_DELETED,
                                      f"Subject '{subject}' Version {v.version} was not deleted first before being "
                                      "permanently deleted")
            self._refuse_referenced(v)
            return Write([(schema_key(subject, v.version), None)], v.version)
        if v.deleted:
            raise e.RegistryError(404, e.VERSION_SOFT_DELETED,
                                  f"Subject '{subject}' Version {v.version} was soft deleted. Set permanent=true to "
                                  "delete permanently")
        self._refuse_referenced(v)
        return Write([self._soft_deleted(v)], v.version)

    def plan_set_config(self, subject: str | None, body: Any) -> Write:
        if not isinstance(body, dict):
            raise e.RegistryError(422, 422, "The request body must be a JSON object")
        unsupported = sorted(k for k, v in body.items()
                             if k not in ("compatibility", "compatibilityLevel", "normalize") and v is not None)
        if unsupported:
            raise e.RegistryError(422, e.INVALID_COMPATIBILITY_LEVEL,
                                  f"Config field(s) {', '.join(unsupported)} not supported by this registry")
        level = body.get("compatibility") or body.get("compatibilityLevel")
        if not isinstance(level, str) or level.upper() not in COMPATIBILITY_LEVELS:
            raise e.RegistryError(422, e.INVALID_COMPATIBILITY_LEVEL,
                                  "Invalid compatibility level. Valid values are none, backward, forward, full, "
                                  "backward_transitive, forward_transitive, and full_transitive")
        normalize = body.get("normalize")
        if normalize is not None and not isinstance(normalize, bool):
            raise e.RegistryError(422, e.INVALID_COMPATIBILITY_LEVEL, "normalize must be true or false")
        level = level.upper()
        result: dict[str, Any] = {"compatibility": level}
        if normalize is not None:
            result["normalize"] = normalize
        return Write([config_record(subject, level, normalize)], result)

    def plan_delete_config(self, subject: str | None) -> Write:
        if subject is not None and subject not in self.configs and subject not in self.subjects:
            raise e.subject_not_found(subject)
        previous = self.get_config(subject, default_to_global=True)
        return Write([config_record(subject, None)], previous)

    def plan_set_mode(self, subject: str | None, body: Any, *, force: bool = False) -> Write:
        if not isinstance(body, dict):
            raise e.RegistryError(422, 422, "The request body must be a JSON object")
        mode = body.get("mode")
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise e.RegistryError(422, e.INVALID_MODE,
                                  "Invalid mode. Valid values are READWRITE, READONLY and IMPORT.")
        mode = mode.upper()
        if mode == "IMPORT" and not force:
            present = self.list_subjects(deleted=True) if subject is None else self._versions(subject, deleted=True)
            if present:
                raise e.not_permitted("Cannot import since found existing subjects")
        return Write([mode_record(subject, mode)], {"mode": mode})

    def plan_delete_mode(self, subject: str) -> Write:
        if subject not in self.modes and subject not in self.subjects:
            raise e.subject_not_found(subject)
        return Write([mode_record(subject, None)], {"mode": self.mode(subject)})
