"""Cluster metadata (topics, partitions, configs) behind one seam: embedded, or in ZooKeeper."""
