"""A heartbeat's age means nothing while the reaper could not reach the registry: engines could not be
heard either (a Postgres failover). Silence is judged only after a whole timeout heard again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from boomerang_reaper.settings import ReaperSettings
from boomerang_reaper.worker import Reaper


def reaper(timeout: float) -> Reaper:
    none: Any = None
    return Reaper(ReaperSettings(engine_heartbeat_timeout_seconds=timeout), none, none, none, "r")


async def test_the_timeout_is_the_setting_once_heard_for_a_whole_timeout() -> None:
    r = reaper(30)
    r._heard_since = asyncio.get_running_loop().time() - 100
    assert r.heartbeat_timeout() == 30


async def test_just_heard_again_the_engines_get_a_whole_timeout_more() -> None:
    r = reaper(30)
    now = asyncio.get_running_loop().time()
    r._heard_since = now
    assert r.heartbeat_timeout() == pytest.approx(60, abs=0.5)
    r._heard_since = now - 10
    assert r.heartbeat_timeout() == pytest.approx(50, abs=0.5)


async def test_off_stays_off() -> None:
    assert reaper(0).heartbeat_timeout() == 0
