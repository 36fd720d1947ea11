"""JSON Schema: validation against its metaschema, references, and Confluent's compatibility rules.

The draft is chosen by ``$schema`` (draft-04, -06, -07, 2019-09, 2020-12; draft-07 when absent). ``$ref``s to
other registered schemas resolve from the references (by reference name and by their ``$id``) through a
``referencing.Registry``; a ``$ref`` that resolves nowhere makes the schema invalid.

Canonical form: compact JSON in the key order given (as Confluent keeps it). Normalized form: compact JSON with keys
sorted.

Compatibility asks whether a reader with one schema accepts every document valid under the writer's, along
Confluent's JSON Schema rules: type widening is compatible, narrowing is not (integer widens to number);
a property added to an open content model must accept anything the writer's additionalProperties allowed there
(so only an empty schema is compatible), while a property added to a closed model (additionalProperties false) is
compatible; a property removed is compatible only when the reader's content model still admits it; a required
property added is incompatible unless it has a default (as Confluent); enums may grow, not shrink; numeric,
string, array and object bounds may relax, not tighten (maximum/minimum with their exclusive forms, multipleOf,
maxLength/minLength, pattern, maxItems/minItems, uniqueItems, maxProperties/minProperties); oneOf/anyOf may gain
branches, allOf may lose them; ``not`` compares reversed. ``if``/``then``/``else``, ``format`` and
``contentMediaType`` are annotations here and not compared.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import referencing
import referencing.exceptions
import referencing.jsonschema

from pykbroker.schema_registry.formats.base import InvalidReference, InvalidSchema

_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "id",
        "$comment",
        "$anchor",
        "$dynamicAnchor",
        "title",
        "description",
        "default",
        "examples",
        "readOnly",
        "writeOnly",
        "deprecated",
        "definitions",
        "$defs",
        "format",
        "contentMediaType",
        "contentEncoding",
        "if",
        "then",
        "else",
    }
)
_MAX_DEPTH = 256  # nesting bound of one comparison (recursive schemas whose $ref carries siblings)
_TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")


def _dumps(value: Any, sort: bool) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort)


def _refs(node: Any) -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                found.append(value)
            elif key not in ("enum", "const", "default", "examples"):
                found.extend(_refs(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_refs(item))
    return found


class JsonSchema:
    schema_type = "JSON"

    def __init__(self, document: Any, validator_cls: Any, registry: referencing.Registry) -> None:
        self.document = document
        self.validator_cls = validator_cls
        self.registry = registry
        self.specification = referencing.jsonschema.specification_with(
            validator_cls.META_SCHEMA.get("$schema", ""), default=referencing.jsonschema.DRAFT7
        )
        root = self.specification.create_resource(document)
        self.resolver = registry.resolver_with_root(root)
        self._canonical = _dumps(document, sort=False)

    @classmethod
    def parse(cls, text: str, references: Mapping[str, str]) -> JsonSchema:
        document = _load(text, "schema")
        validator_cls = _validator_for(document)
        try:
            validator_cls.check_schema(document)
        except jsonschema.exceptions.SchemaError as exc:
            where = "/".join(str(p) for p in exc.absolute_path)
            raise InvalidSchema(f"Invalid schema: {exc.message}" + (f" at '#/{where}'" if where else "")) from exc
        registry: referencing.Registry = referencing.Registry()
        for name, ref_text in references.items():
            contents = _load(ref_text, f"reference {name!r}")
            ref_cls = _validator_for(contents)
            spec = referencing.jsonschema.specification_with(
                ref_cls.META_SCHEMA.get("$schema", ""), default=referencing.jsonschema.DRAFT7
            )
            resource = spec.create_resource(contents)
            registry = registry.with_resource(name, resource)
            ref_id = resource.id()
            if ref_id:
                registry = registry.with_resource(ref_id, resource)
        parsed = cls(document, validator_cls, registry)
        parsed._check_refs()
        return parsed

    def _check_refs(self) -> None:
        """Every $ref (here and in the references) must resolve, else the schema is invalid as in Confluent."""
        pending: list[tuple[Any, Any]] = [(self.document, self.resolver)]
        seen: set[int] = set()
        while pending:
            node, resolver = pending.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            for ref in _refs(node):
                try:
                    resolved = resolver.lookup(ref)
                except referencing.exceptions.Unresolvable as exc:
                    raise InvalidReference(f"Invalid schema: $ref {ref!r} does not resolve: {exc}") from exc
                if not ref.startswith("#"):
                    pending.append((resolved.contents, resolved.resolver))

    def canonical(self) -> str:
        return self._canonical

    def normalized(self) -> str:
        return _dumps(self.document, sort=True)

    def formatted(self, fmt: str) -> str:
        return self._canonical

    def incompatibilities(self, writer: object) -> list[str]:
        """Why a reader with this schema cannot read data written with `writer` ([] when it can)."""
        if not isinstance(writer, JsonSchema):
            return [f"Incompatible schema type: {getattr(writer, 'schema_type', '?')} is not JSON"]
        checker = _Checker(writer, self)
        checker.check(writer.document, writer.resolver, self.document, self.resolver, "#")
        return list(dict.fromkeys(checker.messages))


def _load(text: str, what: str) -> Any:
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise InvalidSchema(f"Invalid schema: the {what} is not JSON: {exc}") from exc
    if not isinstance(document, (dict, bool)):
        raise InvalidSchema(f"Invalid schema: the {what} is neither a JSON object nor a boolean")
    return document


def _validator_for(document: Any) -> Any:
    if isinstance(document, dict) and "$schema" in document:
        uri = document["$schema"]
        known = jsonschema.validators.validator_for({"$schema": uri}, default=None)
        if known is None:
            raise InvalidSchema(f"Invalid schema: unknown $schema {uri!r}")
        return known
    return jsonschema.Draft7Validator


# ---------------------------------------------------------------------------------------------------------------


def _merge(base: dict[str, Any], extra: Any) -> Any:
    """`base` and `extra` both applying (allOf), combined into one schema for the common cases."""
    if extra is True:
        return base
    if extra is False:
        return False
    out = dict(base)
    for key, value in extra.items():
        if key not in out:
            out[key] = value
        elif key == "properties":
            out[key] = {**value, **out[key]}
        elif key == "required":
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key == "type":
            a = out[key] if isinstance(out[key], list) else [out[key]]
            b = value if isinstance(value, list) else [value]
            both = [t for t in a if t in b or (t == "integer" and "number" in b)]
            both += [t for t in b if t == "integer" and "number" in a and t not in both]
            out[key] = both
        elif isinstance(value, bool) or isinstance(out[key], bool):
            continue
        elif key in ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"):
            out[key] = min(out[key], value)
        elif key in ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"):
            out[key] = max(out[key], value)
    return out


def _types(node: dict[str, Any]) -> set[str] | None:
    t = node.get("type")
    if t is None:
        return None
    return set(t) if isinstance(t, list) else {t}


def _allows(types: set[str] | None, kind: str) -> bool:
    if types is None:
        return True
    return kind in types or (kind == "number" and "integer" in types)


def _upper(node: dict[str, Any]) -> tuple[float, bool] | None:
    """The effective upper bound (value, exclusive)."""
    bounds: list[tuple[float, bool]] = []
    if "maximum" in node:
        bounds.append((node["maximum"], node.get("exclusiveMaximum") is True))
    if "exclusiveMaximum" in node and not isinstance(node["exclusiveMaximum"], bool):
        bounds.append((node["exclusiveMaximum"], True))
    return min(bounds, key=lambda b: (b[0], not b[1])) if bounds else None


def _lower(node: dict[str, Any]) -> tuple[float, bool] | None:
    bounds: list[tuple[float, bool]] = []
    if "minimum" in node:
        bounds.append((node["minimum"], node.get("exclusiveMinimum") is True))
    if "exclusiveMinimum" in node and not isinstance(node["exclusiveMinimum"], bool):
        bounds.append((node["exclusiveMinimum"], True))
    return max(bounds, key=lambda b: (b[0], b[1])) if bounds else None


def _array_parts(node: dict[str, Any]) -> tuple[list[Any], Any]:
    """(per-position item schemas, schema of the items after them)."""
    if "prefixItems" in node:
        return list(node["prefixItems"]), node.get("items", True)
    items = node.get("items", True)
    if isinstance(items, list):
        return list(items), node.get("additionalItems", True)
    return [], items


def _property_schema(node: dict[str, Any], name: str) -> Any:
    """The schema an object's property `name` meets when `node` does not list it in properties."""
    matched = [s for pattern, s in node.get("patternProperties", {}).items() if re.search(pattern, name)]
    if matched:
        result: Any = {}
        for s in matched:
            result = _merge(result, s) if result is not False else False
        return result
    return node.get("additionalProperties", True)


class _Checker:
    def __init__(self, writer: JsonSchema, reader: JsonSchema) -> None:
        self.writer = writer
        self.reader = reader
        self.messages: list[str] = []
        self.active: set[tuple[int, int]] = set()

    def fail(self, kind: str, path: str, description: str) -> None:
        self.messages.append(f"{kind}: {description} at path '{path}'")

    def trial(self, w: Any, wres: Any, r: Any, rres: Any, path: str) -> bool:
        saved, self.messages = self.messages, []
        try:
            self.check(w, wres, r, rres, path)
            return not self.messages
        finally:
            self.messages = saved

    def deref(self, node: Any, resolver: Any) -> tuple[Any, Any]:
        hops = 0
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and hops < 64:
            hops += 1
            try:
                resolved = resolver.lookup(node["$ref"])
            except referencing.exceptions.Unresolvable:
                return True, resolver  # parse() checked every $ref; one seen from another scope is not judged
            rest = {k: v for k, v in node.items() if k != "$ref" and k not in _ANNOTATIONS}
            target, resolver = resolved.contents, resolved.resolver
            node = _merge(rest, target) if rest else target
        return node, resolver

    def check(self, w: Any, wres: Any, r: Any, rres: Any, path: str) -> None:
        w, wres = self.deref(w, wres)
        r, rres = self.deref(r, rres)
        key = (id(w), id(r))
        if key in self.active or len(self.active) > _MAX_DEPTH:
            return
        self.active.add(key)
        try:
            self._check(w, wres, r, rres, path)
        finally:
            self.active.discard(key)

    def _check(self, w: Any, wres: Any, r: Any, rres: Any, path: str) -> None:
        if w is False or r is True:
            return
        if isinstance(r, dict) and not (set(r) - _ANNOTATIONS):
            return
        if r is False:
            self.fail("SCHEMA_REMOVED", path, "The reader schema accepts nothing where the writer accepted values")
            return
        if w is True:
            w = {}
        # Writer alternatives: each one must be readable.
        for keyword in ("anyOf", "oneOf"):
            if keyword in w:
                rest = {k: v for k, v in w.items() if k != keyword}
                for i, branch in enumerate(w[keyword]):
                    self.check(_merge(rest, branch), wres, r, rres, f"{path}/{keyword}/{i}")
                return
        if "allOf" in w:
            merged: Any = {k: v for k, v in w.items() if k != "allOf"}
            for branch in w["allOf"]:
                branch, _ = self.deref(branch, wres)
                merged = _merge(merged, branch) if merged is not False else False
            self.check(merged, wres, r, rres, path)
            return
        # Reader alternatives: the writer must fit one of them; reader conjunctions: all of them.
        for keyword in ("anyOf", "oneOf"):
            if keyword in r:
                rest = {k: v for k, v in r.items() if k != keyword}
                if not any(
                    self.trial(w, wres, _merge(rest, branch), rres, f"{path}/{keyword}/{i}")
                    for i, branch in enumerate(r[keyword])
                ):
                    self.fail(
                        "COMBINED_TYPE_SUBSCHEMAS_CHANGED",
                        path,
                        f"No subschema of the reader's {keyword} accepts what the writer schema accepts",
                    )
                self.check(w, wres, rest, rres, path)
                return
        if "allOf" in r:
            rest = {k: v for k, v in r.items() if k != "allOf"}
            for i, branch in enumerate(r["allOf"]):
                self.check(w, wres, branch, rres, f"{path}/allOf/{i}")
            self.check(w, wres, rest, rres, path)
            return
        self.check_not(w, wres, r, rres, path)
        if "enum" in w or "const" in w:
            values = list(w.get("enum", [])) if "enum" in w else [w["const"]]
            validator = self.reader.validator_cls(r, registry=self.reader.registry, _resolver=rres)
            bad = [v for v in values if not validator.is_valid(v)]
            if bad:
                self.fail("ENUM_ARRAY_NARROWED", path, f"The reader schema rejects the writer's values {bad}")
            return
        if "enum" in r or "const" in r:
            self.fail("ENUM_ARRAY_CHANGED", path, "The reader schema restricts values the writer schema does not")
            return
        wtypes, rtypes = _types(w), _types(r)
        if rtypes is not None:
            if wtypes is None:
                self.fail("TYPE_NARROWED", path, f"The reader schema accepts only {sorted(rtypes)}")
            else:
                lost = sorted(t for t in wtypes if not (t in rtypes or (t == "integer" and "number" in rtypes)))
                if lost:
                    self.fail("TYPE_NARROWED", path, f"The reader schema no longer accepts the types {lost}")
        live = wtypes if wtypes is not None else set(_TYPES)
        if rtypes is not None:
            live = {t for t in live if t in rtypes or (t == "integer" and "number" in rtypes)}
        if _allows(live, "number") or "integer" in live:
            self.check_numbers(w, r, path)
        if "string" in live:
            self.check_bound(w, r, "maxLength", path, upper=True)
            self.check_bound(w, r, "minLength", path, upper=False)
            if "pattern" in r and r["pattern"] != w.get("pattern"):
                kind = "PATTERN_CHANGED" if "pattern" in w else "PATTERN_ADDED"
                self.fail(kind, path, f"The reader schema requires the pattern {r['pattern']!r}")
        if "array" in live:
            self.check_arrays(w, wres, r, rres, path)
        if "object" in live:
            self.check_objects(w, wres, r, rres, path)

    def check_not(self, w: dict[str, Any], wres: Any, r: dict[str, Any], rres: Any, path: str) -> None:
        if "not" not in r:
            return
        if "not" not in w:
            self.fail("NOT_TYPE_NARROWED", path, "The reader schema adds a 'not' the writer schema does not have")
        elif not self.trial(r["not"], rres, w["not"], wres, f"{path}/not"):
            self.fail("NOT_TYPE_NARROWED", path, "The reader's 'not' excludes values the writer's does not")

    def check_bound(self, w: dict[str, Any], r: dict[str, Any], key: str, path: str, upper: bool) -> None:
        if key not in r:
            return
        name = key[0].upper() + key[1:]
        name = "".join("_" + c if c.isupper() else c.upper() for c in name).lstrip("_").upper()
        if key not in w:
            self.fail(f"{name}_ADDED", path, f"The reader schema adds {key} {r[key]}")
        elif (w[key] > r[key]) if upper else (w[key] < r[key]):
            self.fail(f"{name}_{'DECREASED' if upper else 'INCREASED'}", path, f"{key} changed {w[key]} -> {r[key]}")

    def check_numbers(self, w: dict[str, Any], r: dict[str, Any], path: str) -> None:
        rmax, wmax = _upper(r), _upper(w)
        if rmax is not None:
            if wmax is None:
                self.fail("MAXIMUM_ADDED", path, f"The reader schema adds a maximum {rmax[0]}")
            elif wmax[0] > rmax[0] or (wmax[0] == rmax[0] and rmax[1] and not wmax[1]):
                self.fail("MAXIMUM_DECREASED", path, f"maximum changed {wmax[0]} -> {rmax[0]}")
        rmin, wmin = _lower(r), _lower(w)
        if rmin is not None:
            if wmin is None:
                self.fail("MINIMUM_ADDED", path, f"The reader schema adds a minimum {rmin[0]}")
            elif wmin[0] < rmin[0] or (wmin[0] == rmin[0] and rmin[1] and not wmin[1]):
                self.fail("MINIMUM_INCREASED", path, f"minimum changed {wmin[0]} -> {rmin[0]}")
        if "multipleOf" in r:
            if "multipleOf" not in w:
                self.fail("MULTIPLE_OF_ADDED", path, f"The reader schema adds multipleOf {r['multipleOf']}")
            else:
                ratio = w["multipleOf"] / r["multipleOf"]
                if not math.isclose(ratio, round(ratio)):
                    self.fail("MULTIPLE_OF_CHANGED", path, f"multipleOf changed {w['multipleOf']} -> {r['multipleOf']}")

    def check_arrays(self, w: dict[str, Any], wres: Any, r: dict[str, Any], rres: Any, path: str) -> None:
        self.check_bound(w, r, "maxItems", path, upper=True)
        self.check_bound(w, r, "minItems", path, upper=False)
        if r.get("uniqueItems") is True and w.get("uniqueItems") is not True:
            self.fail("UNIQUE_ITEMS_ADDED", path, "The reader schema requires unique items")
        wprefix, wrest = _array_parts(w)
        rprefix, rrest = _array_parts(r)
        for i in range(max(len(wprefix), len(rprefix))):
            wi = wprefix[i] if i < len(wprefix) else wrest
            ri = rprefix[i] if i < len(rprefix) else rrest
            self.check(wi, wres, ri, rres, f"{path}/items/{i}")
        self.check(wrest, wres, rrest, rres, f"{path}/items")
        if "contains" in r:
            if "contains" not in w:
                self.fail("CONTAINS_ADDED", path, "The reader schema adds 'contains'")
            else:
                self.check(w["contains"], wres, r["contains"], rres, f"{path}/contains")

    def check_objects(self, w: dict[str, Any], wres: Any, r: dict[str, Any], rres: Any, path: str) -> None:
        self.check_bound(w, r, "maxProperties", path, upper=True)
        self.check_bound(w, r, "minProperties", path, upper=False)
        wprops, rprops = w.get("properties", {}), r.get("properties", {})
        for name in dict.fromkeys([*wprops, *rprops]):
            p = f"{path}/properties/{name}"
            if name in wprops and name in rprops:
                self.check(wprops[name], wres, rprops[name], rres, p)
            elif name in wprops:
                covering = _property_schema(r, name)
                if covering is False:
                    self.fail(
                        "PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL",
                        p,
                        f"The reader schema's closed content model no longer accepts the property {name!r}",
                    )
                elif not self.trial(wprops[name], wres, covering, rres, p):
                    self.fail(
                        "PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                        p,
                        f"The reader schema's content model does not accept the writer's property {name!r}",
                    )
            else:
                writer_side = _property_schema(w, name)
                if writer_side is not False and not self.trial(writer_side, wres, rprops[name], rres, p):
                    self.fail(
                        "PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL",
                        p,
                        f"The writer's open content model allows the property {name!r} with values the reader rejects",
                    )
        wrequired, rrequired = set(w.get("required", [])), r.get("required", [])
        for name in rrequired:
            if name not in wrequired:
                prop = rprops.get(name)
                if not (isinstance(prop, dict) and "default" in prop):
                    self.fail("REQUIRED_ATTRIBUTE_ADDED", f"{path}/required", f"The reader schema requires {name!r}")
        wadd, radd = w.get("additionalProperties", True), r.get("additionalProperties", True)
        if radd is not True and not self.trial(wadd, wres, radd, rres, f"{path}/additionalProperties"):
            self.fail(
                "ADDITIONAL_PROPERTIES_NARROWED",
                f"{path}/additionalProperties",
                "The reader schema accepts fewer additional properties than the writer schema",
            )
        for pattern, schema in r.get("patternProperties", {}).items():
            wside = w.get("patternProperties", {}).get(pattern, wadd)
            self.check(wside, wres, schema, rres, f"{path}/patternProperties/{pattern}")
        wdeps = {**w.get("dependencies", {}), **w.get("dependentRequired", {}), **w.get("dependentSchemas", {})}
        rdeps = {**r.get("dependencies", {}), **r.get("dependentRequired", {}), **r.get("dependentSchemas", {})}
        for name, dep in rdeps.items():
            wdep = wdeps.get(name)
            if isinstance(dep, list) and isinstance(wdep, list):
                if not set(dep) <= set(wdep):
                    self.fail("DEPENDENCY_ARRAY_EXTENDED", f"{path}/dependencies/{name}", "More dependencies")
            elif wdep is None:
                self.fail("DEPENDENCY_ADDED", f"{path}/dependencies/{name}", f"A dependency on {name!r} is added")
            elif not isinstance(dep, list) and not isinstance(wdep, list):
                self.check(wdep, wres, dep, rres, f"{path}/dependencies/{name}")
            else:
                self.fail("DEPENDENCY_CHANGED", f"{path}/dependencies/{name}", f"The dependency on {name!r} changed")
        if "propertyNames" in r and r["propertyNames"] != w.get("propertyNames"):
            self.fail("PROPERTY_NAMES_CHANGED", path, "The reader schema restricts property names")
