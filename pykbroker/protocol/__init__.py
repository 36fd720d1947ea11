"""Wire protocol: framing, request headers, the API table and record batches (all sans-I/O)."""
