"""Who may call without credentials: loopback only, unless the development setting says otherwise."""

from __future__ import annotations

import pytest
from boomerang.auth import (
    ANONYMOUS,
    INSECURE_ANONYMOUS,
    LOCAL_ANONYMOUS,
    AnonymousAccess,
    Principal,
    anonymous_access,
    client_token,
    is_loopback,
)


@pytest.mark.parametrize("listen", ["127.0.0.1:50051", "127.1.2.3:0", "[::1]:50051", "localhost:8000", "LOCALHOST:1"])
def test_loopback_listeners(listen: str) -> None:
    assert is_loopback(listen)


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "[::]:50051", ":::50051", "10.0.0.5:1", "registry:50051",
                                    "example.com:443", "[::ffff:10.0.0.1]:1", "128.0.0.1:1"])
def test_wildcards_addresses_and_names_are_beyond_loopback(listen: str) -> None:
    assert not is_loopback(listen)


def test_anonymous_policy_by_listener_and_settings() -> None:
    assert anonymous_access("127.0.0.1:0", False, False) is AnonymousAccess.LOOPBACK
    assert anonymous_access("0.0.0.0:0", False, False) is AnonymousAccess.REFUSED
    assert anonymous_access("[::]:0", False, False) is AnonymousAccess.REFUSED
    assert anonymous_access("127.0.0.1:0", True, False) is AnonymousAccess.REFUSED
    assert anonymous_access("0.0.0.0:0", False, True) is AnonymousAccess.INSECURE
    with pytest.raises(ValueError, match="contradict"):
        anonymous_access("0.0.0.0:0", True, True)


def test_only_an_admitted_anonymous_caller_acts_for_engines() -> None:
    assert AnonymousAccess.REFUSED.principal is None
    assert AnonymousAccess.LOOPBACK.principal == LOCAL_ANONYMOUS
    assert AnonymousAccess.INSECURE.principal == INSECURE_ANONYMOUS
    assert not ANONYMOUS.may_act_for_engine("d-0")
    assert not Principal("anonymous", "anything-else").may_act_for_engine("d-0")
    assert LOCAL_ANONYMOUS.may_act_for_engine("d-0") and INSECURE_ANONYMOUS.may_act_for_engine("d-0")
    assert Principal.parse("service:gateway").may_act_for_engine("d-0")
    engine = Principal.parse("engine:d-0")
    assert engine.may_act_for_engine("d-0") and not engine.may_act_for_engine("d-1")
    with pytest.raises(ValueError):
        Principal.parse("anonymous:loopback")  # no certificate or token can claim it


def test_token_from_the_variable_or_a_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("BOOMERANG_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("BOOMERANG_AUTH_TOKEN_FILE", raising=False)
    assert client_token() == ""
    path = tmp_path / "router.token"
    path.write_text("bmr_fromfile\n")
    monkeypatch.setenv("BOOMERANG_AUTH_TOKEN_FILE", str(path))
    assert client_token() == "bmr_fromfile"
    path.write_text("bmr_rotated\n")
    assert client_token() == "bmr_rotated"
    monkeypatch.setenv("BOOMERANG_AUTH_TOKEN", "bmr_env")
    assert client_token() == "bmr_env"  # the variable wins
    monkeypatch.delenv("BOOMERANG_AUTH_TOKEN")
    monkeypatch.setenv("BOOMERANG_AUTH_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="BOOMERANG_AUTH_TOKEN_FILE"):
        client_token()
