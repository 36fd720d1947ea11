"""The partitions this broker holds, below the coordinators and the request handlers that build on them:
each partition's replicas, high watermark and ISR, the produces and fetches waiting on them
(replica_manager), topic creation and deletion (topics), and the group commit of appends (group_commit)."""
