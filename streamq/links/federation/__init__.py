"""Exchange and queue federation at run time, as RabbitMQ's federation plugin.

`runtime.Federation` keeps one link per federated exchange or queue and upstream
(`exchange_link`, `queue_link`, their common part in `link`); `headers` has the names
and headers RabbitMQ's plugin uses. The links speak AMQP through `streamq.links.amqp`
and see the broker only through its vhosts' listeners and `Broker.links`.
"""
