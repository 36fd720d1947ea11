"""The broker process: network edge, request dispatch, API handlers and the replica layer."""
