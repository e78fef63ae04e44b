"""The project's documents stand on their own: nothing points outside the repository, every
relative link resolves, README.md starts with the two commands and its Layout section names
every folder and package, every page under docs/ is in the index, the configuration reference is what the
settings generate, and every `BOOMERANG_*` variable a document names exists in the code."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from boomerang_tools import configdoc

ROOT = Path(__file__).resolve().parents[2]
# Written in pieces so this file does not name them itself.
FORBIDDEN = ["../" + "shared", "VLLM_FACTS" + ".md", "DESIGN" + ".md"]
SKIP_DIRS = {".git", ".venv", "build", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}


def tracked_files() -> list[Path]:
    """The files git tracks (or, outside a checkout, every file but caches and build output)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if p.is_file() and not any(_skipped(d) for d in p.relative_to(ROOT).parts[:-1])]


def _skipped(folder: str) -> bool:
    """Caches, build output and hidden folders (but `.ci`) are no part of the project's tree."""
    return folder in SKIP_DIRS or folder.endswith(".egg-info") or (folder.startswith(".") and folder != ".ci")


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in tracked_files():
        if not path.is_file():  # deleted in the working tree, not yet committed
            continue
        data = path.read_bytes()
        found += [f"{path.relative_to(ROOT)}: {word}" for word in FORBIDDEN if word.encode() in data]
    assert found == []


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def links(text: str) -> list[str]:
    """The targets of a Markdown file's inline links and images, outside code blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [a or b for a, b in LINK.findall(text)]


def test_link_parser() -> None:
    md = "See [a](docs/a.md#x), ![img](i.png), [web](https://x.y) and `[not](code.md)`.\n```\n[no](b.md)\n```"
    assert links(md) == ["docs/a.md#x", "i.png", "https://x.y"]


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))])
def test_relative_links_resolve_to_files_in_the_repository(doc: str) -> None:
    path = ROOT / doc
    broken = []
    for target in links(path.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor on the same page
        resolved = (path.parent / target.split("#", 1)[0]).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(target)
    assert broken == []


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (outside code blocks)."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_anchor_parser() -> None:
    md = "# Today (2026-12-02)\n## Settings (`kv_extra`)\n### The skeptic's question: why not P?\n```\n# not one\n```"
    assert anchors(md) == {"today-2026-12-02", "settings-kv_extra", "the-skeptics-question-why-not-p"}


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))])
def test_every_anchor_names_a_heading(doc: str) -> None:
    path = ROOT / doc
    broken = []
    for target in links(path.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or "#" not in target:
            continue
        file, fragment = target.split("#", 1)
        page = (path.parent / file).resolve() if file else path
        if page.suffix == ".md" and page.exists() and fragment not in anchors(page.read_text()):
            broken.append(target)
    assert broken == []


def layout_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def test_the_layout_names_every_top_level_folder_and_package() -> None:
    block = layout_block()
    files = [p.relative_to(ROOT) for p in tracked_files()]
    folders = {p.parts[0] for p in files if len(p.parts) > 1}
    packages = {p.parent.as_posix() for p in files if p.name == "__init__.py" and p.parent.as_posix() != "tests"}
    suites = {f"tests/{p.parts[1]}" for p in files if len(p.parts) > 2 and p.parts[0] == "tests"}
    missing = sorted(
        [f for f in folders if not re.search(rf"(^|[\s,]){re.escape(f)}/", block, re.MULTILINE)]
        + [p for p in packages | suites if f"{p}/" not in block]
    )
    assert missing == []
    # ...and names nothing that is not there.
    named = set(re.findall(r"^([\w.][\w./-]*/)", block, re.MULTILINE))
    assert sorted(n for n in named if not (ROOT / n).is_dir()) == []


def test_the_readme_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```", 2)[1]
    assert "make demo" in first_block and "make test" in first_block


def test_every_page_under_docs_is_in_the_index() -> None:
    index = links((ROOT / "docs" / "README.md").read_text())
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert [p for p in pages if not any(t.split("#", 1)[0] == p for t in index)] == []


def test_the_configuration_reference_is_what_the_settings_generate() -> None:
    text = configdoc.DOC.read_text()
    assert configdoc.render(text) == text, f"docs/configuration.md is stale: run `{configdoc.COMMAND}`"


def test_the_generator_rewrites_a_stale_table_and_refuses_a_missing_one() -> None:
    text = configdoc.DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `BOOMERANG_CLAIM_DEADLINE_MS`"))
    stale = text.replace(row + "\n", "").replace("<!-- settings: reaper -->\n", "<!-- settings: reaper -->\n| old |\n")
    assert stale != text and configdoc.render(stale) == text
    with pytest.raises(ValueError, match="settings: gateway"):
        configdoc.render(text.replace("<!-- settings: gateway -->", ""))
    with pytest.raises(ValueError, match="unknown settings table 'nope'"):
        configdoc.render(text + "<!-- settings: nope -->\n<!-- end settings -->\n")


VARIABLE = re.compile(r"BOOMERANG_[A-Z0-9_]*[A-Z0-9](?:_\*)?")  # `BOOMERANG_TLS_*` names a family


def test_every_variable_a_document_names_exists_in_the_code() -> None:
    """A setting renamed in the code and not in the prose fails here (the prose is not generated)."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {v for doc in docs for v in VARIABLE.findall(doc.read_text())}
    code = "\n".join(
        p.read_text(errors="replace") for p in tracked_files() if p.is_file() and p.suffix != ".md" and p.stat().st_size < 1_000_000
    )
    fields = [f for classes in configdoc.TABLES.values() for c in classes for f in c.model_fields.items()]
    settings = {f"BOOMERANG_{name.upper()}" for name, _ in fields}
    def exists(name: str) -> bool:
        stem = name.removesuffix("*")
        return stem in code or any(s.startswith(stem) if stem != name else s == name for s in settings)

    assert sorted(v for v in named if not exists(v)) == []
