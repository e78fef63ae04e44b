"""Each service's flags are derived from its settings class: one flag per setting, its help from the `Field`.

A setting is declared once (its `Field`); these tests fail if a flag is written by hand beside it,
if a setting has no flag or two, if a help text repeats its default, or if a flag users and
deploy files rely on stops working.
"""

from __future__ import annotations

import argparse
import re

import pytest
from boomerang_cli.main import build_parser
from boomerang_gateway.settings import GatewaySettings
from boomerang_reaper.settings import ReaperSettings
from boomerang_registry.settings import RegistrySettings
from boomerang_router.settings import RouterSettings
from boomerang_server.config import (
    InvalidSettings,
    env_name,
    flag_dest,
    flag_spec,
    render_default,
    settings_from_args,
)
from pydantic_settings import BaseSettings

SERVICES: dict[str, type[BaseSettings]] = {
    "registry": RegistrySettings,
    "router": RouterSettings,
    "reaper": ReaperSettings,
    "gateway": GatewaySettings,
}
# Flags that tests, docs, deploy files and `boomerang up` pass today: they must keep working.
KNOWN_FLAGS = {
    "registry": ["--listen", "--ttl-margin-seconds", "--database-url", "--db-pool-size", "--grace-seconds",
                 "--log-level", "--metrics-listen"],
    "router": ["--listen", "--registry", "--prefill", "--decode", "--claim-deadline-ms", "--min-remaining-seconds",
               "--block-size", "--kv-recompute-threshold", "--heartbeat-timeout-seconds", "--engine-refresh-seconds",
               "--health-check-seconds", "--metrics-listen"],
    "reaper": ["--listen", "--registry", "--replica-id", "--leader-lease-seconds", "--engine-heartbeat-timeout-seconds",
               "--engine-sweep-interval-seconds", "--retention-days", "--max-sleep-seconds", "--metrics-listen"],
    "gateway": ["--listen", "--router", "--registry", "--prefill", "--decode", "--allow-anonymous", "--engine-hook",
                "--sticky-prefill", "--plan-timeout-seconds", "--tokenize-timeout-seconds", "--max-body-bytes",
                "--tenant-requests-per-second", "--tenant-burst", "--database-url"],
}


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(command)
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]  # type: ignore[no-any-return]


def _settings_actions(command: str) -> list[argparse.Action]:
    skip = {"help", "verbose", "handler"}
    return [a for a in _subparser(command)._actions if a.option_strings and a.dest not in skip]


@pytest.mark.parametrize("command", SERVICES)
def test_every_setting_has_exactly_one_flag_and_every_flag_is_a_setting(command: str) -> None:
    cls = SERVICES[command]
    flags = {a.option_strings[0]: a.dest for a in _settings_actions(command)}
    wanted = {flag_spec(name, field).name: name for name, field in cls.model_fields.items()}
    assert sorted(flags) == sorted(wanted), "a flag without a setting, or a setting without a flag"
    assert all(dest == flag_dest(flag) for flag, dest in flags.items())


@pytest.mark.parametrize("command", SERVICES)
def test_each_help_shows_its_default_and_variable_once(command: str) -> None:
    cls = SERVICES[command]
    names = {flag_spec(name, field).name: name for name, field in cls.model_fields.items()}
    for action in _settings_actions(command):
        name = names[action.option_strings[0]]
        field, text = cls.model_fields[name], action.help or ""
        assert len(re.findall(r"\bdefault\b", text, re.IGNORECASE)) == 1, (name, text)
        assert f"(default: {render_default(field, empty='none')}; {env_name(name)})" in text.replace("%%", "%")
        assert text.startswith((field.description or "")[:20]), (name, text)


@pytest.mark.parametrize("command", SERVICES)
def test_the_flags_users_pass_today_still_exist(command: str) -> None:
    known = {s for a in _subparser(command)._actions for s in a.option_strings}
    assert [f for f in KNOWN_FLAGS[command] if f not in known] == []


def _settings(command: str, argv: list[str]) -> BaseSettings:
    args = build_parser(command).parse_args([command, *argv])
    return settings_from_args(SERVICES[command], args)


def test_a_flag_wins_over_its_variable_and_an_absent_flag_leaves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOOMERANG_CLAIM_DEADLINE_MS", "70")
    monkeypatch.setenv("BOOMERANG_BLOCK_SIZE", "32")
    settings = _settings("router", ["--claim-deadline-ms", "90", "--registry", "10.0.0.1:1",
                                    "--prefill", "p1=http://a:1", "--prefill", "http://b:2"])
    assert isinstance(settings, RouterSettings)
    assert settings.claim_deadline_ms == 90 and settings.block_size == 32
    assert settings.registry_address == "10.0.0.1:1"
    assert settings.prefill_engines == ["p1=http://a:1", "http://b:2"]


def test_on_off_flags_set_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOOMERANG_ENGINE_HOOK", "true")
    assert _settings("gateway", []).engine_hook is True  # type: ignore[attr-defined]
    assert _settings("gateway", ["--no-engine-hook"]).engine_hook is False  # type: ignore[attr-defined]
    assert _settings("gateway", ["--allow-anonymous", "--router", ""]).allow_anonymous is True  # type: ignore[attr-defined]


def test_a_bad_value_names_its_variable_and_its_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    # One line (issue 26): the command words it as its failure (boomerang_cli.failures), exit status 1.
    with pytest.raises(InvalidSettings) as exc:
        _settings("reaper", ["--registry", "nowhere"])
    assert str(exc.value).startswith("invalid configuration: BOOMERANG_REGISTRY_ADDRESS (--registry): must be HOST:PORT")
    assert "\n" not in str(exc.value) and str(exc.value).endswith("; fix that flag or variable")
    monkeypatch.setenv("BOOMERANG_ENGINE_REFRESH_SECONDS", "-1")
    monkeypatch.setenv("BOOMERANG_DB_POOL_SIZE", "0")
    with pytest.raises(InvalidSettings) as exc:
        _settings("gateway", [])
    assert "BOOMERANG_ENGINE_REFRESH_SECONDS (--engine-refresh-seconds): " in str(exc.value)
    assert "BOOMERANG_DB_POOL_SIZE (--db-pool-size): Input should be greater than or equal to 1; " in str(exc.value)
    assert len(exc.value.problems) == 2 and "\n" not in str(exc.value)


def test_a_flag_of_the_wrong_type_is_refused_by_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser("router").parse_args(["router", "--block-size", "many"])
    assert exc.value.code == 2
    assert "--block-size: invalid int value: 'many'" in capsys.readouterr().err
