"""The services' protobuf timestamps (`ts`) agree with protobuf's own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from boomerang_server.rpc.server import ts
from google.protobuf.timestamp_pb2 import Timestamp


@pytest.mark.parametrize(
    "value",
    [
        datetime(2025, 12, 3, 11, 34, 5, 123456, tzinfo=UTC),
        datetime(2025, 12, 3, 11, 34, 5, 999999, tzinfo=timezone(timedelta(hours=-7, minutes=-30))),
        datetime(1960, 2, 29, 23, 59, 59, 1, tzinfo=UTC),  # before the epoch: negative seconds, positive nanos
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(2025, 6, 1, 8, 0, 0, 500000),  # naive: read as UTC, as FromDatetime reads it
    ],
)
def test_timestamps_match_protobufs_from_datetime(value: datetime) -> None:
    expected = Timestamp()
    expected.FromDatetime(value)
    assert ts(value) == expected


def test_no_time_is_no_timestamp() -> None:
    assert ts(None) is None


def test_epoch_seconds_are_a_timestamp_as_of_that_utc_time() -> None:
    expected = Timestamp()
    expected.FromDatetime(datetime.fromtimestamp(1764761645.25, tz=UTC))
    assert ts(1764761645.25) == expected
