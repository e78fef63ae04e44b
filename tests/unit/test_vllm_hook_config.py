"""The hook's settings from `kv_connector_extra_config`: defaults, and errors that name the key."""

from __future__ import annotations

from typing import Any

import pytest
from boomerang_vllm_hook.config import HookConfigError, parse_config


def extra(**boomerang: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"role": "decode", "registry": "127.0.0.1:50051", "tenant": "acme"}
    base.update(boomerang)
    return {"bidirectional_kv_xfer": True, "decoder_kv_blocks_ttl": 480, "kv_recompute_threshold": 64, "boomerang": base}


def error_of(value: Any) -> str:
    with pytest.raises(HookConfigError) as err:
        parse_config(value)
    return str(err.value)


def test_decode_defaults() -> None:
    cfg = parse_config(extra())
    b = cfg.boomerang
    assert (cfg.decoder_kv_blocks_ttl, cfg.kv_recompute_threshold) == (480, 64)
    assert b.plan_deadline_ms == 20.0 and b.queue_size == 10_000 and b.when_full == "drop_oldest"
    assert b.heartbeat_interval_seconds == 5.0 and b.batch_size == 64 and b.plan_with == "chain"


def test_prefill_needs_router_not_registry() -> None:
    cfg = parse_config(extra(role="prefill", registry="", router="localhost:50061", plan_deadline_ms=35))
    assert cfg.boomerang.router == "localhost:50061" and cfg.boomerang.plan_deadline_ms == 35
    assert "needs `router`" in error_of(extra(role="prefill"))


def test_decode_needs_registry() -> None:
    assert "kv_connector_extra_config.boomerang: a decode engine needs `registry`" in error_of(extra(registry=""))


def test_missing_section_and_role() -> None:
    assert "kv_connector_extra_config.boomerang: is required" in error_of({"bidirectional_kv_xfer": True})
    assert "kv_connector_extra_config.boomerang: is required" in error_of(None)
    body = extra()
    del body["boomerang"]["role"]
    assert "kv_connector_extra_config.boomerang.role: Field required" in error_of(body)


def test_every_bad_key_is_named_at_once() -> None:
    message = error_of(extra(registry="nohost", plan_deadline_ms=0, queue_size=0, when_full="block", heartbeat_interval_seconds=-1))
    for key in ("registry", "plan_deadline_ms", "queue_size", "when_full", "heartbeat_interval_seconds"):
        assert f"kv_connector_extra_config.boomerang.{key}:" in message, message
    assert "HOST:PORT" in message


def test_deadline_bounds() -> None:
    assert "boomerang.plan_deadline_ms: Input should be less than or equal to 1000" in error_of(extra(plan_deadline_ms=1001))


def test_typo_is_refused() -> None:
    assert "kv_connector_extra_config.boomerang.registy: Extra inputs are not permitted" in error_of(extra(registy="x:1"))


def test_bidirectional_transfer_must_be_on() -> None:
    body = extra()
    body["bidirectional_kv_xfer"] = False
    assert "kv_connector_extra_config.bidirectional_kv_xfer: must be true" in error_of(body)


def test_tenant_or_trust_required() -> None:
    assert "set `tenant`" in error_of(extra(tenant=""))
    assert parse_config(extra(tenant="", trust_request_tenant=True)).boomerang.trust_request_tenant


def test_tls_files(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "boomerang.tls_ca_file: no such file" in error_of(extra(tls_ca_file=str(tmp_path / "missing.pem")))
    pem = tmp_path / "ca.pem"
    pem.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    assert "go together" in error_of(extra(tls_cert_file=str(pem)))
    tls = parse_config(extra(tls_ca_file=str(pem))).boomerang.tls()
    assert tls.enabled and tls.ca == str(pem) and not tls.cert
    monkeypatch.delenv("BOOMERANG_TLS_CA_FILE", raising=False)
    monkeypatch.delenv("BOOMERANG_TLS_CERT_FILE", raising=False)
    assert not parse_config(extra()).boomerang.tls().enabled
    monkeypatch.setenv("BOOMERANG_TLS_CA_FILE", str(pem))
    assert parse_config(extra()).boomerang.tls().ca == str(pem)


def test_url_and_token(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "boomerang.http_base_url: must start with http://" in error_of(extra(http_base_url="10.0.0.1:8000"))
    assert parse_config(extra(http_base_url="http://10.0.0.1:8000/")).boomerang.http_base_url == "http://10.0.0.1:8000"
    monkeypatch.setenv("BOOMERANG_AUTH_TOKEN", "from-env")
    assert parse_config(extra()).boomerang.token() == "from-env"
    assert parse_config(extra(auth_token="inline")).boomerang.token() == "inline"
