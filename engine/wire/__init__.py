"""What crosses a process boundary and how: the msgpack codecs with declared types
(``codec``; nothing is ever unpickled from the network), every control and data message
(``messages``) and the framing and authentication of the data connections (``transport``).

May import: ``engine.errors``, ``engine.names``. (The columnar path registers its
Arrow IPC frames here: ``ColumnarFrameCodec``.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.names import lazy_exports

if TYPE_CHECKING:
    from engine.wire.codec import register_codec, register_dataclass
    from engine.wire.messages import JobStatus, decode_message, encode_message
    from engine.wire.transport import TLS

# name -> its module, imported on first use: importing the package loads none of its
# modules, so it costs nothing and closes no import cycle; the imports above are the same
# names for type checkers and the layer test (tests/unit/test_public_api.py checks both agree)
_EXPORTS: dict[str, str] = {
    "register_codec": "engine.wire.codec",
    "register_dataclass": "engine.wire.codec",
    "JobStatus": "engine.wire.messages",
    "decode_message": "engine.wire.messages",
    "encode_message": "engine.wire.messages",
    "TLS": "engine.wire.transport",
}

__all__ = [
    "decode_message",
    "encode_message",
    "JobStatus",
    "register_codec",
    "register_dataclass",
    "TLS",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
