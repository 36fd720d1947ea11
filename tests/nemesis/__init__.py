"""The fault campaign: random, seeded fault schedules against a 3-broker ZooKeeper cluster under real clients'
load, checked for the anomalies Jepsen's Kafka analyses look for."""
