"""The MQTT gateway (3.1.0 "MQIsdp", 3.1.1 and 5.0): codec, then session, then listeners.

Only the sans-IO codec (`mqtt_gateway.codec`) exists so far; the session state machine,
the listeners (TCP 1883, TLS 8883, WebSocket `/mqtt`) and the mapping onto the broker core
land with the rest of issue 33. It may import `streamq`, never another gateway.
"""
