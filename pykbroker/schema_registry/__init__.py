"""Confluent's Schema Registry REST API served by the broker, stored in the compacted topic ``_schemas``
(docs/schema-registry.md)."""
