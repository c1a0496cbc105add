"""Decisions as values, the decision log, and what makes a controller."""

from __future__ import annotations

import pytest

from controllers.base import Controller
from engine.control.reconfiguration import (
    ChangeLogic,
    DecisionKind,
    DecisionLog,
    DecisionOutcome,
    NoChange,
    Place,
    Rebalance,
    Scale,
    as_decisions,
    check_controller,
    record_of,
)
from engine.errors import ControllerError
from engine.wire.messages import decode_message, encode_message


def test_decisions_are_validated_values_with_a_reason():
    s = Scale("agg", 4, reason="busy")
    assert (s.kind, s.parallelism, s.protocol, s.reason) == (DecisionKind.SCALE, 4, "drrs", "busy")
    assert str(s) == "scale 'agg' to 4 (drrs)"
    r = Rebalance("agg", [0, 1, 1, 0])
    assert r.assignment == (0, 1, 1, 0) and r.parallelism == 2
    assert "place task 1 of 'agg'" in str(Place("agg", 1, "abcdef0123456789"))
    with pytest.raises(AttributeError):
        s.parallelism = 5  # type: ignore[misc]
    for bad, match in [
        (lambda: Scale("agg", 0), "parallelism"),
        (lambda: Scale("agg", True), "parallelism"),
        (lambda: Scale("", 2), "operator"),
        (lambda: Scale("agg", 2, protocol=3), "protocol"),
        (lambda: Scale("agg", 2, assignment=[]), "empty"),
        (lambda: Rebalance("agg", "0101"), "unknown assignment strategy '0101'"),
        (lambda: Rebalance("agg", None), "assignment"),
        (lambda: Scale("agg", 2, balance=0.2), "go with an assignment strategy"),
        (lambda: Rebalance("agg", [0, 1], balance=0.2), "go with an assignment strategy"),
        (lambda: Scale("agg", 2, assignment="ssm", balance=-1), "balance"),
        (lambda: Scale("agg", 2, assignment="ssm", balance=True), "balance"),
        (lambda: Rebalance("agg", [0, -1]), "task index"),
        (lambda: ChangeLogic("agg", None), "fn"),
        (lambda: Place("agg", -1, "n"), "task_index"),
        (lambda: Place("agg", 0, ""), "node"),
        (lambda: NoChange(3), "reason"),
    ]:
        with pytest.raises(ControllerError, match=match):
            bad()


def test_scale_and_rebalance_name_an_assignment_strategy():
    s = Scale("agg", 4, assignment="ssm", balance=0.2)
    assert s.strategy == "ssm" and s.balance == 0.2 and str(s) == "scale 'agg' to 4 (drrs, assignment ssm)"
    assert Scale("agg", 4, assignment=(0, 1)).strategy is None
    assert str(Scale("agg", 4, assignment=(0, 1))) == "scale 'agg' to 4 (drrs with a chosen assignment)"
    r = Rebalance("agg", "ssm", balance=0.5)
    assert r.strategy == "ssm" and r.parallelism is None  # the current one
    assert str(r) == "rebalance 'agg' by ssm (drrs)"
    m = Scale("agg", 3, assignment="mtm", projected_costs="/tmp/pmc")
    assert m.strategy == "mtm" and m.projected_costs == "/tmp/pmc"


def test_records_say_what_was_decided_and_what_became_of_it():
    rec = record_of(10.0, "ds2", Scale("agg", 4, reason="busy"), DecisionOutcome.REFUSED,
                    "RescaleRefused: no such operator")
    assert (rec.kind, rec.operator, rec.outcome) == ("scale", "agg", "refused")
    assert "ds2: scale 'agg' to 4 (drrs) -> refused (busy): RescaleRefused" in str(rec)
    assert decode_message(encode_message(rec)) == rec
    junk = record_of(11.0, "mine", 42, DecisionOutcome.ERROR, "not a decision")
    assert junk.kind == DecisionKind.INVALID and "int: 42" in junk.decision


def test_the_log_folds_repeated_no_changes_and_stays_bounded():
    log = DecisionLog(capacity=3)
    for t in range(5):
        log.add(record_of(float(t), "ds2", NoChange("within band"), DecisionOutcome.NO_CHANGE))
    (only,) = log.records()
    assert only.repeats == 5 and only.at == 0.0 and only.last_at == 4.0
    log.add(record_of(5.0, "other", NoChange("within band"), DecisionOutcome.NO_CHANGE))
    log.add(record_of(6.0, "ds2", NoChange("within band"), DecisionOutcome.NO_CHANGE))
    assert [r.repeats for r in log.records("ds2")] == [6]  # another controller in between
    log.add(record_of(7.0, "ds2", Scale("agg", 2), DecisionOutcome.EXECUTED))
    log.add(record_of(8.0, "ds2", NoChange("within band"), DecisionOutcome.NO_CHANGE))
    log.add(record_of(9.0, "ds2", NoChange("stabilising"), DecisionOutcome.NO_CHANGE))
    assert len(log) == 3  # the oldest dropped
    assert [r.reason or r.decision for r in log.records()] == [
        "scale 'agg' to 2 (drrs)", "within band", "stabilising"]
    assert log.counts[("ds2", "no-change", "no-change")] == 8
    assert log.counts[("ds2", "scale", "executed")] == 1


class Fine(Controller):
    interval_s = 1.0

    def decide(self, metrics, view):
        return None


def test_what_makes_a_controller():
    assert check_controller(Fine()) == "Fine"
    named = Fine()
    named.name = "mine"
    assert check_controller(named) == "mine"
    with pytest.raises(ControllerError, match="runs already"):
        check_controller(Fine(), taken=["Fine"])
    with pytest.raises(ControllerError, match="no decide"):
        check_controller(object())
    slow = Fine()
    slow.interval_s = 0
    with pytest.raises(ControllerError, match="interval_s"):
        check_controller(slow)
    with pytest.raises(TypeError):
        Controller()  # type: ignore[abstract]


def test_what_decide_returns_becomes_a_list():
    assert isinstance(as_decisions(None)[0], NoChange)
    assert isinstance(as_decisions([])[0], NoChange)
    s = Scale("a", 2)
    assert as_decisions(s) == [s] and as_decisions((s, s)) == [s, s]
    assert as_decisions("junk") == ["junk"]
