"""`boomerang up`'s pieces: the --sim spec and the PostgreSQL binaries hint."""

from __future__ import annotations

import pytest
from boomerang_tools.stack.postgres import INSTALL_HINT
from boomerang_tools.stack.stack import SimSpec, sims_for


def test_sim_spec_ports() -> None:
    assert sims_for("1x1", "qwen3-32b") == [SimSpec("prefill", "qwen3-32b", 8100), SimSpec("decode", "qwen3-32b", 8200)]
    two = sims_for("2X3", "glm-5-fp8", 0, 0)
    assert [s.role for s in two] == ["prefill"] * 2 + ["decode"] * 3 and {s.port for s in two} == {0}
    assert [s.port for s in sims_for("2x1", "p")] == [8100, 8101, 8200]
    for bad in ("1", "0x1", "x", "1x17", "ax1"):
        with pytest.raises(ValueError):
            sims_for(bad, "p")


def test_install_hint_says_what_to_do() -> None:
    assert "apt-get install postgresql" in INSTALL_HINT and "--database-url" in INSTALL_HINT


def test_flags_become_the_settings_variables_and_a_bad_flag_is_named() -> None:
    from boomerang_gateway.settings import GatewaySettings
    from boomerang_tools.stack.stack import flags_env

    env = flags_env(["--engine-hook", "--plan-timeout-seconds", "0.25"], GatewaySettings)
    assert env == {"BOOMERANG_ENGINE_HOOK": "true", "BOOMERANG_PLAN_TIMEOUT_SECONDS": "0.25"}
    with pytest.raises(ValueError, match="--plan-timeout-seconds needs a value"):
        flags_env(["--plan-timeout-seconds"], GatewaySettings)
    with pytest.raises(ValueError, match="--no-such-flag is no flag of GatewaySettings"):
        flags_env(["--no-such-flag"], GatewaySettings)
