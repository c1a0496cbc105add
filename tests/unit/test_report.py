"""A rescale report that was cut short never reads as done (issue 19, item 6).

``RescaleReport`` carries ``key_groups_planned`` (after every older field, and only fields
with defaults after it, so reports encoded before it existed still decode) and prints as one line that says "cut short" with "moved X of Y
planned key groups" whenever it was superseded or moved fewer groups than planned; the
examples print reports only through it.
"""

from __future__ import annotations

import ast
import dataclasses
import os

import pytest

from engine.wire.codec import pack_exact
from engine.wire.messages import decode_message, encode_message
from migration.report import RescaleReport

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def report(moved: int, planned: int, superseded: bool = False, **kw: object) -> RescaleReport:
    return RescaleReport("count", "drrs", 2, 4, 100.0, 119.85, 19.85, moved, 5120, (),
                         superseded=superseded, key_groups_planned=planned, **kw)


def test_key_groups_planned_and_every_later_field_have_defaults():
    fields = dataclasses.fields(RescaleReport)
    at = [f.name for f in fields].index("key_groups_planned")
    assert fields[at].default == 0
    assert all(f.default is not dataclasses.MISSING for f in fields[at:])


def test_report_round_trips_and_an_older_encoding_decodes_with_zero_planned():
    r = report(12, 96, superseded=True)
    assert decode_message(encode_message(r)) == r
    # a report encoded before the field existed: every field before it
    names = [f.name for f in dataclasses.fields(r)]
    older = ["RescaleReport", *[getattr(r, n) for n in names[:names.index("key_groups_planned")]]]
    decoded = decode_message(pack_exact(older))
    assert decoded.key_groups_planned == 0 and decoded.superseded
    assert decoded.assignment == "" and decoded.predicted_bytes is None


def test_a_finished_rescale_reads_as_done():
    r = report(96, 96)
    assert not r.cut_short
    assert str(r) == "drrs rescale of 'count' 2 -> 4 done in 19.85 s: moved 96 key groups " \
                     "(5120 bytes)"
    assert "cut short" not in str(r) and "superseded" not in str(r)


def test_a_superseded_rescale_says_cut_short_with_moved_of_planned():
    r = report(12, 96, superseded=True)
    assert r.cut_short
    text = str(r)
    assert "cut short" in text and "superseded" in text
    assert "moved 12 of 96 planned key groups" in text
    assert "done" not in text
    assert r.summary() == text


def test_fewer_groups_moved_than_planned_is_cut_short_even_without_superseded():
    r = report(40, 96)
    assert r.cut_short
    assert "cut short" in str(r) and "moved 40 of 96 planned key groups" in str(r)


def test_superseded_without_a_planned_count_still_says_cut_short():
    r = report(12, 0, superseded=True)
    assert r.cut_short
    assert "cut short" in str(r) and "moved 12 key groups" in str(r)
    assert "planned was not reported" in str(r)


def test_a_scale_in_that_planned_nothing_is_done():
    r = report(0, 0)
    assert not r.cut_short and "done" in str(r)


# ---------------------------------------------------------------- where reports are printed

PRINTERS = ["examples/wordcount.py", "examples/fraud_detection.py", "examples/stock_exchange.py",
            "examples/twitch.py", "examples/nexmark/run.py", "engine/cli.py"]
REPORT_FIELDS = {"key_groups_moved", "duration_s", "old_parallelism", "new_parallelism",
                 "bytes_moved"}


@pytest.mark.parametrize("path", PRINTERS)
def test_examples_print_reports_only_through_str(path):
    """A hand-made line from the report's fields is how a cut-short rescale read as done;
    the examples and the CLI print ``report`` itself."""
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read())
    hand_made = sorted({node.attr for node in ast.walk(tree)
                        if isinstance(node, ast.Attribute) and node.attr in REPORT_FIELDS})
    assert hand_made == [], f"{path} formats report fields by hand: {hand_made}"


def test_wordcount_prints_the_report_of_the_protocol_its_docstring_names():
    with open(os.path.join(ROOT, "examples/wordcount.py")) as f:
        source = f.read()
    tree = ast.parse(source)
    doc = ast.get_docstring(tree) or ""
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == "rescale"]
    assert len(calls) == 1
    [protocol] = [kw.value for kw in calls[0].keywords if kw.arg == "protocol"]
    if not isinstance(protocol, ast.Constant):  # --rescale-protocol: its default
        defaults = [kw.value.value for node in ast.walk(tree) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value == "--rescale-protocol"
                    for kw in node.keywords if kw.arg == "default"]
        assert defaults == ["drrs"]
    else:
        assert protocol.value == "drrs"
    assert "drrs" in doc and "stop-restart" not in doc
    assert "cut short" in doc
    printed = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
               and isinstance(node.func, ast.Name) and node.func.id == "print"
               and len(node.args) == 1 and isinstance(node.args[0], ast.Name)
               and node.args[0].id == "report"]
    assert len(printed) == 1
