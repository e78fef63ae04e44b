"""The repository's tooling: protos lint clean, stubs match, compose and Makefile are real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from boomerang_cli.main import commands
from boomerang_tools.protogen import check

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_protos_pass_buf_lint() -> None:
    out = subprocess.run([str(BIN / "buf"), "lint"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_committed_stubs_match_the_protos() -> None:
    assert check(ROOT / "client") == []


def test_compose_parses_and_every_command_is_a_boomerang_subcommand() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert "postgres" in services and "registry" in services
    known = set(commands())
    image_services = [s for s in services.values() if s.get("image") == "boomerang:dev"]
    assert image_services
    for service in image_services:
        assert service["command"][0] in known, service["command"]
        for dep, cond in service.get("depends_on", {}).items():
            assert dep in services and cond["condition"].startswith("service_")
    assert services["postgres"]["healthcheck"]["test"]


def test_compose_commands_parse_with_the_real_cli() -> None:
    from boomerang_cli.main import build_parser

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    parser = build_parser()
    for service in compose["services"].values():
        if service.get("image") == "boomerang:dev":
            parser.parse_args(service["command"])  # exits (fails the test) on an unknown flag


def test_dockerfile_installs_the_locked_requirements() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "requirements.lock" in text and 'ENTRYPOINT ["boomerang"]' in text
    # Runtime pins only, Boomerang from a wheel: no test tools and no editable install.
    assert "requirements-dev.lock" not in text
    assert " -e " not in text and "--editable" not in text
    for folder in ("libs", "services"):
        assert f"COPY {folder} ./{folder}" in text, f"the image build lacks {folder}/"


def test_make_help_lists_every_target() -> None:
    makefile = (ROOT / "Makefile").read_text()
    phony = next(line for line in makefile.splitlines() if line.startswith(".PHONY:"))
    targets = phony.split(":", 1)[1].split()
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True)
    for target in targets:
        assert f"  {target} " in out.stdout, f"`make help` does not list {target}"


def test_grpcio_and_tools_share_a_version() -> None:
    lock = dict(
        line.split("==")
        for name in ("requirements.lock", "requirements-dev.lock")
        for line in (ROOT / name).read_text().splitlines()
        if "==" in line
    )
    assert lock["grpcio"] == lock["grpcio-tools"]


def test_the_configuration_reference_documents_every_setting() -> None:
    import importlib

    from pydantic_settings import BaseSettings

    modules = ["boomerang_server.config"] + [f"boomerang_{s}.settings" for s in ("registry", "router", "reaper", "gateway")]
    reference = (ROOT / "docs" / "configuration.md").read_text()
    missing = []
    for obj in (o for m in modules for o in vars(importlib.import_module(m)).values()):
        if isinstance(obj, type) and issubclass(obj, BaseSettings) and obj is not BaseSettings:
            for name in obj.model_fields:
                if f"`BOOMERANG_{name.upper()}`" not in reference:
                    missing.append(f"BOOMERANG_{name.upper()} ({obj.__name__})")
    assert missing == [], "docs/configuration.md lacks (run `python -m boomerang_tools.configdoc`): " + ", ".join(missing)


def test_readme_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    head = readme[:400]
    assert "make demo" in head and "make test" in head
    assert "make test" in (ROOT / ".ci" / "run").read_text()
