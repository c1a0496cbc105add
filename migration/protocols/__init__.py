"""Rescaling protocols. ``PROTOCOLS`` lists the names ``JobHandle.rescale`` accepts."""

PROTOCOLS = ("stop-restart",)
