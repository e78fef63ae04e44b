"""The two conductors stay readable top to bottom, and a method's name says its layer.

The router's plan (`planner.py`) and the gateway's turn (`turn.py`) import their steps, not
the steps' details, so each imports few of its sibling modules (`tests/unit/test_imports.py`
checks that only the serving modules import them). And a method of the turn's vocabulary
(plan, report, claim, release, turn) is defined in one layer only: `plan` in the gateway
and `plan` in the router once meant two different things under one name. Client methods
named after their RPC are the exception, and so is the service that serves that RPC.

Read from the source with `ast`, like test_imports.py.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLANNER = ROOT / "services/router/boomerang_router/planner.py"
TURN = ROOT / "services/gateway/boomerang_gateway/turn.py"
# Sibling modules each conductor may import: today's count, so a detail that moves back into
# a conductor fails here (before this budget: planner.py 11, turn.py 9).
SIBLING_BUDGET = {PLANNER: 6, TURN: 10}

# The layers a plan and a turn cross. The reaper is not held to the names rule yet: its
# leader election's and repository's `release` and its worker's `sweep_engines` (beside the
# registry's) are left for the reaper's own rework.
LAYERS = {
    "registry": ROOT / "services/registry/boomerang_registry",
    "router": ROOT / "services/router/boomerang_router",
    "gateway": ROOT / "services/gateway/boomerang_gateway",
    "hook": ROOT / "hook/src/boomerang_vllm_hook",
    "clients": ROOT / "client/boomerang/clients",
}
SERVICE_PROTOS = {"registry": "registry_service.proto", "router": "router_service.proto"}
TURN_WORDS = {"plan", "report", "claim", "release", "turn"}

Definitions = dict[str, set[tuple[str, str]]]  # method name → {(layer, "file.py:Class")}


def sibling_imports(path: Path) -> set[str]:
    """The modules of its own package that a module imports."""
    package = path.parent.name
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == package:
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
            found.add((node.module or "").split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith(package + ".")}
    return found


def test_the_scan_sees_a_conductors_imports() -> None:
    assert {"ledger", "reuse_claim", "engine_choice"} <= sibling_imports(PLANNER)
    assert {"control", "engine_calls"} <= sibling_imports(TURN)


def test_each_conductor_imports_few_of_its_siblings() -> None:
    over = {path.name: sorted(sibling_imports(path)) for path, budget in SIBLING_BUDGET.items()
            if len(sibling_imports(path)) > budget}
    assert over == {}


def served_rpcs() -> dict[str, set[str]]:
    """Each RPC's snake_case name (the client's method name) → the layers that serve it."""
    served: dict[str, set[str]] = defaultdict(set)
    for layer, proto in SERVICE_PROTOS.items():
        text = (ROOT / "proto/boomerang/v1" / proto).read_text()
        for rpc in re.findall(r"^\s*rpc (\w+)", text, re.MULTILINE):
            served[re.sub(r"(?<!^)(?=[A-Z])", "_", rpc).lower()].add(layer)
    return served


def method_definitions() -> Definitions:
    """Every method (dunders aside) of every class in each layer."""
    found: Definitions = defaultdict(set)
    for layer, base in LAYERS.items():
        for path in sorted(base.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("__"):
                            found[item.name].add((layer, f"{path.name}:{node.name}"))
    return found


def names_without_their_layer(defs: Definitions, served: dict[str, set[str]]) -> dict[str, list[str]]:
    """Names that do not say their layer: an RPC's name defined outside the clients and the
    service that serves it, or a turn-vocabulary name defined in two layers."""
    out: dict[str, list[str]] = {}
    for name, where in defs.items():
        layers = {layer for layer, _ in where}
        if name in served:
            wrong = layers - {"clients"} - served[name]
        elif TURN_WORDS & set(name.strip("_").split("_")):
            wrong = layers if len(layers) > 1 else set()
        else:
            continue
        if wrong:
            out[name] = sorted(f"{layer}:{at}" for layer, at in where)
    return out


def test_a_turn_method_name_says_its_layer() -> None:
    assert names_without_their_layer(method_definitions(), served_rpcs()) == {}


def test_the_names_rule_catches_a_name_used_in_two_layers() -> None:
    served = served_rpcs()
    assert served["complete_turn"] == {"registry"} and served["plan_turn"] == {"router"}
    defs: Definitions = {
        "plan": {("gateway", "control.py:ControlPlane"), ("router", "planner.py:Router")},
        "complete_turn": {("clients", "registry.py:RegistryClient"), ("router", "registry_api.py:RouterRegistry")},
        "plan_turn": {("clients", "router.py:RouterClient"), ("router", "planner.py:Router")},
        "close": {("gateway", "engines.py:EnginePool"), ("router", "spool.py:AuditSpool")},
        "end_turn": {("registry", "batching.py:RegistrationBatcher")},
    }
    assert set(names_without_their_layer(defs, served)) == {"plan", "complete_turn"}
