"""The project's documents stand on their own: nothing points outside the repository, every
relative link resolves, and README.md's Layout section names every folder and package."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

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
