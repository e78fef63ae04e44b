"""`boomerang-vllm-hook` (with `boomerang-client`, its one Boomerang dependency) alone inside vLLM's
environment.

This virtualenv also holds Boomerang itself (the suite's fixtures run its services and
migrations), so these tests set it aside: `pip` must resolve the hook's wheel against what
vLLM's environment already has, offline; and a fresh interpreter that sees the unpacked wheels
before anything else must let vLLM build the BoomerangConnector from them, every `boomerang` and
`boomerang_vllm_hook` module it loads coming from the wheels and no service module loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.hook_wheel import build_hook_wheels

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build_hook_wheels(tmp_path_factory.mktemp("hook-wheel"))


def test_pip_installs_the_hook_from_vllms_environment_offline(wheels: tuple[Path, Path]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--disable-pip-version-check",
         "--report", "-", "--quiet", *map(str, wheels)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    installs = [item["metadata"]["name"] for item in json.loads(done.stdout)["install"]]
    # Offline, so every third-party dependency was satisfied by vLLM's set; Boomerang's own two
    # may already be there (this virtualenv holds them for the suite's engines).
    assert set(installs) <= {"boomerang-client", "boomerang-vllm-hook"}


# vLLM imports the connector from `kv_connector_module_path` while it builds the scheduler.
ALONE = r"""
import json, sys
wheel_dir, root, model_dir = sys.argv[1:4]
sys.path[:0] = [wheel_dir, root]
from tests.vllm.engine import build_engine

engine = build_engine(model_dir, "p-alone", {"role": "prefill", "router": "127.0.0.1:9",
                                             "registry": "127.0.0.1:9", "tenant": "acme"}, num_blocks=64)
connector = type(engine.connector)
engine.shutdown()
ours = ("boomerang", "boomerang_vllm_hook")
outside = sorted(m for m, mod in list(sys.modules.items())
                 if m.split(".")[0] in ours and not (getattr(mod, "__file__", None) or wheel_dir).startswith(wheel_dir))
services = sorted(m for m in sys.modules if m.split(".")[0].startswith("boomerang_") and m.split(".")[0] not in ours)
print(json.dumps({"connector": f"{connector.__module__}.{connector.__name__}", "outside": outside,
                  "services": services}))
"""


def test_vllm_builds_the_connector_from_the_wheels_alone(wheels: tuple[Path, Path], model_dir: Path,
                                                         tmp_path: Path) -> None:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp_path)
    done = subprocess.run([sys.executable, "-I", "-c", ALONE, str(tmp_path), str(ROOT), str(model_dir)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"connector": "boomerang_vllm_hook.connector.BoomerangConnector", "outside": [], "services": []}
