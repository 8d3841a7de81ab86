"""Layer L3, the broker core: vhosts, exchanges, bindings, routing and queues' life cycles.

Speaks in domain terms (queue, exchange, offset), never frames or reply codes.
"""
