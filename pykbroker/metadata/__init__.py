"""Cluster metadata (topics, partitions, configs) behind one seam: embedded now, ZooKeeper next."""
