"""Observability: counters kept on the hot path (stats), the Prometheus view of the broker (collector,
lag) and the HTTP endpoint that serves it (endpoint)."""
