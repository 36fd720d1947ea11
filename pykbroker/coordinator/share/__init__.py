"""Share groups (KIP-932): queue-like consumption where members share partitions record by record."""
