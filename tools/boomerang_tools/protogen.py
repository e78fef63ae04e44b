"""Generate the Python stubs from `proto/` (or check that the committed ones match).

`python -m boomerang_tools.protogen OUT_DIR` writes `OUT_DIR/boomerang/v1/*_pb2*.py(i)`;
`--check` generates into a temporary folder and fails on any difference, so stubs that
drift from the protos break the test run.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    """The project's .proto files, sorted."""
    return sorted((PROTO_DIR / "boomerang" / "v1").glob("*.proto"))


def generate(out_dir: Path) -> None:
    """Run protoc (from grpcio-tools) on every proto into `out_dir`."""
    include = str(resources.files("grpc_tools") / "_proto")
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p.relative_to(PROTO_DIR)) for p in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the messages above")


def generated_names(folder: Path) -> set[str]:
    """Names of generated stub files in `folder`."""
    if not folder.is_dir():
        return set()
    return {p.name for p in folder.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}


def check(out_dir: Path) -> list[str]:
    """Differences between the committed stubs and freshly generated ones."""
    committed = out_dir / "boomerang" / "v1"
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / "boomerang" / "v1"
        want, have = generated_names(fresh), generated_names(committed)
        problems = [f"missing stub {name}" for name in sorted(want - have)]
        problems += [f"stale stub {name} (no proto)" for name in sorted(have - want)]
        for name in sorted(want & have):
            if not filecmp.cmp(fresh / name, committed / name, shallow=False):
                problems.append(f"stub {name} differs from its proto")
        return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="folder that holds the boomerang package")
    parser.add_argument("--check", action="store_true", help="fail if stubs differ")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.out_dir)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run `make proto` and commit the result", file=sys.stderr)
        return 1 if problems else 0
    generate(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
