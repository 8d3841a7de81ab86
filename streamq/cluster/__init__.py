"""Clustering: replication of the data directory, leader election and membership on etcd."""
