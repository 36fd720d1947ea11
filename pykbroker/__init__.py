"""pykbroker: a message broker in Python that speaks Apache Kafka's binary protocol."""

__version__ = "0.1.0"
