"""The gateway with BOOMERANG_ENGINE_HOOK: the engines plan, the gateway names the conversation."""

from __future__ import annotations

import pytest
from boomerang_gateway.control import FIRST_TURN, engine_plan
from boomerang_gateway.settings import GatewaySettings


def test_the_prefill_engine_gets_the_conversation_and_tenant_beside_the_first_turn_params() -> None:
    plan = engine_plan("c-1", "acme")
    assert plan.decision == "ENGINE" and plan.reason == "ENGINE_HOOK"
    assert plan.kv_transfer_params == {**FIRST_TURN, "boomerang": {"conversation_id": "c-1", "tenant": "acme"}}
    # No plan id: nothing is ever reported from the gateway for it (the hooks report).
    assert plan.plan_id == "" and plan.reused_tokens == 0 and plan.prefill_url == ""
    assert "boomerang" not in FIRST_TURN  # the shared first-turn form is not changed


def test_a_turn_without_a_conversation_is_cold_and_names_none() -> None:
    plan = engine_plan("", "acme")
    assert plan.decision == "COLD" and plan.kv_transfer_params == FIRST_TURN


def test_the_setting_is_off_by_default_and_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert GatewaySettings().engine_hook is False
    monkeypatch.setenv("BOOMERANG_ENGINE_HOOK", "true")
    assert GatewaySettings().engine_hook is True
