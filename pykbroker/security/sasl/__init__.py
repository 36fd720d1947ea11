"""SASL authentication (Kafka's SaslServerAuthenticator), sans-I/O.

``authenticator`` holds the per-connection state machine the dispatcher drives; ``plain`` and
``scram`` the server side of the mechanisms; ``jaas`` the JAAS option parser; ``client`` the
client side the broker uses on its inter-broker connections.
"""

from pykbroker.security.sasl.errors import SaslFailure

# Mechanisms pykbroker implements, in the order they are listed in errors.
IMPLEMENTED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
# What the broker can log in with on its own inter-broker connections.
CLIENT_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

__all__ = ["CLIENT_MECHANISMS", "IMPLEMENTED_MECHANISMS", "SaslFailure"]
