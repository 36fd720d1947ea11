"""The ZooKeeper-mode controller: one broker at a time elects partition leaders for the cluster.

Sans-I/O parts (assignment, election, context) are plain modules; controller.py does the
ZooKeeper I/O on its own event thread.
"""
