"""Distinct integer types for the identifiers the codec hands to the protocol layer.

This module owns the `NewType`s of STYLE.md section 4 that the AMQP codec produces:
a `ChannelId` is a frame's channel number (0 is the connection itself) and a
`DeliveryTag` numbers deliveries per channel, from 1. It holds no logic.
"""

from __future__ import annotations

from typing import NewType

ChannelId = NewType("ChannelId", int)
DeliveryTag = NewType("DeliveryTag", int)
