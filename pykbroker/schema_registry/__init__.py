"""Confluent's Schema Registry REST API served by the broker, stored in the compacted `_schemas` topic."""
