"""The registry's block-seconds meter: retained blocks integrated between refreshes."""

from __future__ import annotations

import pytest
from boomerang_registry.metrics import BlockSecondsMeter


def test_first_refresh_counts_nothing_then_integrates_the_trapezoid() -> None:
    meter = BlockSecondsMeter()
    assert meter.advance({"d1": 100}, 10.0) == {}
    assert meter.advance({"d1": 300, "d2": 40}, 15.0) == pytest.approx({"d1": 1000.0, "d2": 100.0})
    # d2 released everything: its last interval still counts the blocks it held at its start.
    assert meter.advance({"d1": 300}, 20.0) == pytest.approx({"d1": 1500.0, "d2": 100.0})
    assert meter.advance({"d1": 300}, 20.0) == {}  # no time passed
    assert meter.advance({}, 25.0) == pytest.approx({"d1": 750.0})
    assert meter.advance({}, 30.0) == {}
