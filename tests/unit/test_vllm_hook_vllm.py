"""The vLLM glue itself: importable without vLLM, and (where vLLM is installed) a true
NixlConnector subclass whose overrides keep vLLM's signatures."""

from __future__ import annotations

import importlib
import inspect

import pytest

from boomerang.vllm_hook.mixin import BoomerangConnectorMixin

HOOKS = ("get_num_new_matched_tokens", "update_state_after_alloc", "request_finished")


def test_connector_module_imports_without_vllm() -> None:
    module = importlib.import_module("boomerang.vllm_hook.connector")
    try:
        import vllm  # noqa: F401
    except ImportError:
        assert module.VLLM_AVAILABLE is False and not hasattr(module, "BoomerangConnector")
    else:  # pragma: no cover - only where vLLM is installed
        assert module.VLLM_AVAILABLE is True


def test_mixin_signatures_follow_vllm_facts() -> None:
    params = {name: list(inspect.signature(getattr(BoomerangConnectorMixin, name)).parameters) for name in HOOKS}
    assert params == {
        "get_num_new_matched_tokens": ["self", "request", "num_computed_tokens"],
        "update_state_after_alloc": ["self", "request", "blocks", "num_external_tokens"],
        "request_finished": ["self", "request", "block_ids"],
    }


@pytest.mark.vllm
def test_boomerang_connector_is_a_nixl_connector() -> None:
    pytest.importorskip("vllm")
    from boomerang.vllm_hook.connector import BoomerangConnector, NixlConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    assert issubclass(BoomerangConnector, NixlConnector)
    assert BoomerangConnector.__mro__[1] is BoomerangConnectorMixin
    assert KVConnectorRole.SCHEDULER.name == "SCHEDULER"
    for name in HOOKS:
        ours = list(inspect.signature(getattr(BoomerangConnector, name)).parameters)
        theirs = list(inspect.signature(getattr(NixlConnector, name)).parameters)
        assert ours == theirs, (name, ours, theirs)


@pytest.mark.vllm
def test_vllm_resolves_the_connector_from_the_documented_config() -> None:
    pytest.importorskip("vllm")
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from boomerang.vllm_hook.connector import BoomerangConnector

    config = KVTransferConfig(
        kv_connector="BoomerangConnector",
        kv_connector_module_path="boomerang.vllm_hook.connector",
        kv_role="kv_both",
        kv_connector_extra_config={"bidirectional_kv_xfer": True, "boomerang": {"role": "decode"}},
    )
    resolve = getattr(KVConnectorFactory, "get_connector_class", None) or getattr(
        KVConnectorFactory, "_get_connector_class", None
    )
    if resolve is None:
        pytest.skip("this vLLM's KVConnectorFactory exposes no class lookup")
    assert resolve(config) is BoomerangConnector
