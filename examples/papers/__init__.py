"""Reproductions of the rescaling papers' experiments on reflow, one script per paper
(``examples/papers/<paper>.py``; ``reflow bench papers`` lists them, README.md says what each
reproduces). They reuse the bench harness (``examples/bench/harness``) and write
``results.json``, a PNG in the paper's style and ``summary.md`` (the paper's figure or number
beside reflow's) under ``examples/papers/results/<paper>/``.

Guarantees: importing the package starts nothing and imports neither Ray nor matplotlib.
"""

from __future__ import annotations

import os

#: this folder
PAPERS_DIR = os.path.dirname(os.path.abspath(__file__))
#: where full runs write (and are committed); quick runs write to ``<paper>-quick/``
RESULTS_ROOT = os.path.join(PAPERS_DIR, "results")
