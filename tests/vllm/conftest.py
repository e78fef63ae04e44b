"""The real-vLLM suite: runs only in the virtualenv that `tests/vllm/venv.sh` builds.

`make test` runs it there (vLLM 0.33.0, the CPU build of torch, and Boomerang). In the main
virtualenv, which has no vLLM, pytest does not collect this folder; inside the vLLM one, a
missing or different vLLM is an error, never a skip.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

VLLM_VERSION = "0.33.0"

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("BOOMERANG_VLLM_SUITE") == "1":
        raise RuntimeError("BOOMERANG_VLLM_SUITE=1 but vllm is not importable: run it through `make test-vllm`")
    collect_ignore_glob = ["*.py"]
else:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the wheel is the CUDA build; there is no GPU here
    with warnings.catch_warnings():
        # torch 2.13 warns about its own deprecated `torch.jit` API while vLLM imports.
        warnings.simplefilter("ignore", DeprecationWarning)
        import vllm
        import vllm.v1.core.sched.scheduler

    if vllm.__version__ != VLLM_VERSION:
        raise RuntimeError(f"the vLLM suite pins vLLM {VLLM_VERSION}; found {vllm.__version__}")

    from tests.support.procs import ServiceProcess
    from tests.vllm.engine import tiny_model

    @pytest.fixture(scope="session")
    def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
        """A weightless model config vLLM can build a `VllmConfig` from."""
        return tiny_model(tmp_path_factory.mktemp("tiny-llama"))

    @pytest.fixture(scope="module")
    def registry(database_url: str) -> Iterator[ServiceProcess]:
        """A real `boomerang registry` process."""
        proc = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": database_url}).start()
        yield proc
        proc.kill()

    # These tests are about what reaches vLLM's scheduler, not the router's latency: a roomy
    # claim deadline keeps a loaded CI machine from turning a PULL into a degraded COLD.
    ROUTER_ENV = {"BOOMERANG_CLAIM_DEADLINE_MS": "3000"}

    @pytest.fixture(scope="module")
    def router(database_url: str, registry: ServiceProcess) -> Iterator[ServiceProcess]:
        """A real `boomerang router` process, reading engines from the registry."""
        proc = ServiceProcess(
            ["router", "--listen", "127.0.0.1:0", "--registry", registry.address, "--engine-refresh-seconds", "0.2"],
            {"BOOMERANG_DATABASE_URL": database_url, **ROUTER_ENV},
        ).start()
        yield proc
        proc.kill()

    @pytest.fixture(scope="module")
    def reaper(database_url: str, registry: ServiceProcess) -> Iterator[ServiceProcess]:
        """A real `boomerang reaper` process (expiry and engine liveness)."""
        proc = ServiceProcess(
            ["reaper", "--listen", "127.0.0.1:0", "--registry", registry.address, "--replica-id", "vllm-suite"],
            {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_DRAIN_DELAY_SECONDS": "0"},
        ).start()
        yield proc
        proc.kill()
