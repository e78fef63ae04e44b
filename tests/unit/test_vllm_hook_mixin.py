"""The connector module without vLLM: importable, and the mixin's overrides keep vLLM
0.33.0's signatures (tests/vllm/ checks them against vLLM itself)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect

from boomerang_vllm_hook.connector import BoomerangConnectorMixin


def test_connector_module_imports_without_vllm() -> None:
    module = importlib.import_module("boomerang_vllm_hook.connector")
    assert module.VLLM_AVAILABLE is (importlib.util.find_spec("vllm") is not None)
    assert hasattr(module, "BoomerangConnector") is module.VLLM_AVAILABLE


def test_mixin_signatures_follow_vllm() -> None:
    names = ("get_num_new_matched_tokens", "update_state_after_alloc", "request_finished", "request_finished_all_groups", "shutdown")
    params = {name: list(inspect.signature(getattr(BoomerangConnectorMixin, name)).parameters) for name in names}
    assert params == {
        "get_num_new_matched_tokens": ["self", "request", "num_computed_tokens"],
        "update_state_after_alloc": ["self", "request", "blocks", "num_external_tokens"],
        "request_finished": ["self", "request", "block_ids"],
        "request_finished_all_groups": ["self", "request", "block_ids"],
        "shutdown": ["self"],
    }
