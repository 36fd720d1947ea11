"""The transaction coordinator (KIP-98): producer ids, transaction state and markers."""
