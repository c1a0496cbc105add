"""Time: the injectable clock every engine module reads (``clock``), and event time
(``event_time``): windows and window assigners, watermark strategies, and the watermark
tracker a task keeps over its inputs (holds and releases during a live rescale included).

May import: ``engine.errors``, ``engine.names``."""
