"""Rescaling protocols. ``PROTOCOLS`` lists the names ``JobHandle.rescale`` accepts."""

PROTOCOLS = ("drrs", "stop-restart")
