"""`streamq ctl` over the management HTTP API: lavinmqctl's verbs against a running broker.

A client of the broker's HTTP API through the standard library alone (no aiohttp, no
import of `http_gateway` or `amqp_gateway`): `client` (requests, errors, exit statuses),
`output` (tables and JSON), `commands` (the verbs and their flags) and one module per
family of verbs (`accounts`, `entities`, `node`). `streamq.ctl` sits above it and adds the
offline account verbs on a stopped broker's data directory.
"""
