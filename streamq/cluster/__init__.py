"""Clustering: election and membership on etcd, replication of the data directory from
the leader to its followers, and a node's life as leader or follower (docs/clustering.md).

This layer sits directly below the command line: it runs the broker (`streamq.app`) and
nothing below it imports from here; the broker sees the cluster only through
`Broker.cluster`.
"""
