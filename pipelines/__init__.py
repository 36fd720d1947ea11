"""Example data pipelines that run against pykbroker (see docs/spark.md)."""
