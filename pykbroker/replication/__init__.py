"""Replication between brokers (cluster mode): follower fetching and the rules both sides follow."""
