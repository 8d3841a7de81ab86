"""The HTTP gateway (layer L4): the management API, beginning with policies."""
