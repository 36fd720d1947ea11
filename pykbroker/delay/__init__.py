"""Delayed delivery: records held in ``__delayed_records`` until they fall due (docs/queues.md)."""
