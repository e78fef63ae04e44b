"""The connector as vLLM 0.33.0 loads it, and the stand-in's surface held against vLLM's.

`tests/support/vllm_standin.py` keeps the fast unit tests fast; these tests fail as soon as
it drifts from what vLLM's real scheduler calls, with which types, and what vLLM's real
NixlConnector returns.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from boomerang_vllm_hook.connector import (
    VLLM_AVAILABLE,
    BoomerangConnector,
    BoomerangConnectorMixin,
    NixlConnector,
)
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole, supports_hma

from tests.support import vllm_standin
from tests.vllm.engine import build_engine

pytestmark = pytest.mark.vllm
# Every connector method Boomerang's mixin overrides.
OVERRIDES = ("get_num_new_matched_tokens", "update_state_after_alloc", "request_finished", "request_finished_all_groups", "shutdown")
# Connector methods vLLM 0.33.0's scheduler calls that the hook leaves to the NixlConnector
# (neither overridden nor modelled by the stand-in). A method the scheduler starts calling
# that is in neither list fails the surface test: decide whether the hook must act there.
LEFT_TO_NIXL = ("build_connector_meta", "get_kv_connector_stats", "get_loaded_kv_cache_group_ids", "on_new_request", "take_events",
                "update_connector_output")
# What the hook reads from vLLM's Request.
REQUEST_FIELDS = ("request_id", "prompt_token_ids", "all_token_ids", "kv_transfer_params", "sampling_params",
                  "num_computed_tokens", "num_preemptions")


def test_the_connector_is_a_nixl_connector_with_vllms_signatures() -> None:
    assert VLLM_AVAILABLE
    assert issubclass(BoomerangConnector, NixlConnector) and supports_hma(BoomerangConnector)
    assert BoomerangConnector.__mro__[1] is BoomerangConnectorMixin
    for name in OVERRIDES:
        ours = list(inspect.signature(getattr(BoomerangConnector, name)).parameters)
        theirs = list(inspect.signature(getattr(NixlConnector, name)).parameters)
        assert ours == theirs, (name, ours, theirs)


def test_vllm_resolves_the_connector_from_the_readme_config() -> None:
    config = KVTransferConfig(
        kv_connector="BoomerangConnector",
        kv_connector_module_path="boomerang_vllm_hook.connector",
        kv_role="kv_consumer",
        kv_connector_extra_config={"bidirectional_kv_xfer": True, "boomerang": {"role": "decode"}},
    )
    assert KVConnectorFactory.get_connector_class(config) is BoomerangConnector


class Recorder:
    """Wraps a connector instance's methods; records (method, argument types) per call."""

    def __init__(self, connector: Any):
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        for name in dir(type(connector)):
            if name.startswith("_") or not callable(getattr(type(connector), name, None)):
                continue
            if isinstance(inspect.getattr_static(type(connector), name), (classmethod, staticmethod, property)):
                continue
            self._wrap(connector, name)

    def _wrap(self, connector: Any, name: str) -> None:
        real = getattr(connector, name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args))
            return real(*args, **kwargs)

        setattr(connector, name, recorded)

    def called(self) -> set[str]:
        return {name for name, _ in self.calls}

    def args(self, name: str) -> list[tuple[Any, ...]]:
        return [args for called, args in self.calls if called == name]


def shape(value: Any) -> Any:
    """A value's type structure: ints, lists and tuples of them, dicts by their keys."""
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, tuple):
        return ("tuple", sorted({repr(shape(v)) for v in value}))
    if isinstance(value, list):
        return ("list", sorted({repr(shape(v)) for v in value}))
    return type(value).__name__


def run_real_turn(model_dir: Path) -> tuple[Recorder, Recorder, dict[str, Any], dict[str, Any], Any]:
    """One turn through vLLM's real P and D schedulers, no control plane (hooks unconfigured
    for the network: nothing here depends on Boomerang's services)."""
    p = build_engine(model_dir, "surface-p", {"role": "prefill", "router": "127.0.0.1:9", "registry": "127.0.0.1:9", "tenant": "acme"})
    d = build_engine(model_dir, "surface-d", {"role": "decode", "registry": "127.0.0.1:9", "tenant": "acme"})
    rp, rd = Recorder(p.connector), Recorder(d.connector)
    try:
        prompt = list(range(100, 300))
        p.submit("p1", prompt, 1, {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                   "remote_block_ids": None, "remote_host": None, "remote_port": None})
        p_params = p.run(["p1"])["p1"].kv_transfer_params
        d.submit("d1", prompt, 12, p_params)
        request = d.scheduler.requests["d1"]
        d_params = d.run(["d1"])["d1"].kv_transfer_params
        d.submit("d2", prompt, 50, dict(p_params, remote_request_id="p1-again"))
        d.step()
        d.abort(["d2"])
    finally:
        p.shutdown()
        d.shutdown()
    return rp, rd, p_params, d_params, request


@pytest.fixture(scope="module")
def real(model_dir: Path) -> tuple[Recorder, Recorder, dict[str, Any], dict[str, Any], Any]:
    return run_real_turn(model_dir)


def run_standin_turn() -> tuple[dict[str, Any], dict[str, Any], vllm_standin.Request]:
    """The same turn through the stand-in, the way the unit tests drive it."""
    cfg = {"bidirectional_kv_xfer": True, "decoder_kv_blocks_ttl": 480, "kv_recompute_threshold": 64}
    p = vllm_standin.StandInNixlConnector(vllm_standin.vllm_config("sp", cfg), vllm_standin.KVConnectorRole.SCHEDULER)
    d = vllm_standin.StandInNixlConnector(vllm_standin.vllm_config("sd", cfg), vllm_standin.KVConnectorRole.SCHEDULER)
    prompt = list(range(100, 300))
    p1 = vllm_standin.Request("p1", prompt, {"do_remote_decode": True, "do_remote_prefill": False}, output_token_ids=[5],
                              status="FINISHED_LENGTH_CAPPED")
    _, p_params = p.request_finished_all_groups(p1, vllm_standin.block_ids_for(200, 16))
    d1 = vllm_standin.Request("d1", prompt, p_params, output_token_ids=list(range(12)), status="FINISHED_LENGTH_CAPPED")
    _, d_params = d.request_finished_all_groups(d1, vllm_standin.block_ids_for(211, 16))
    assert p_params is not None and d_params is not None
    return p_params, d_params, d1


def conforms(value: Any, hint: Any) -> bool:
    """Whether a value vLLM passed fits the type the stand-in declares for that parameter."""
    if hint is Any:
        return True
    if hint is vllm_standin.Request:  # vLLM's own Request, with every field the hook reads
        return all(hasattr(value, name) for name in REQUEST_FIELDS)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is None:
        return isinstance(value, hint) and not (hint is int and isinstance(value, bool))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return isinstance(value, tuple) and all(conforms(v, args[0]) for v in value)
    if origin is list:
        return isinstance(value, list) and all(conforms(v, args[0]) for v in value)
    raise AssertionError(f"conforms() does not know {hint!r}: extend it")


def test_the_scheduler_calls_only_what_the_standin_models(real: Any) -> None:
    rp, rd, *_ = real
    called = rp.called() | rd.called()
    # vLLM 0.33.0 ends requests on the NixlConnector through request_finished_all_groups.
    assert "request_finished_all_groups" in called and "request_finished" not in called
    for name in OVERRIDES:
        if name in called:
            assert callable(getattr(vllm_standin.StandInNixlConnector, name, None)), f"the stand-in lacks {name}"
            ours = list(inspect.signature(getattr(vllm_standin.StandInNixlConnector, name)).parameters)
            theirs = list(inspect.signature(getattr(NixlConnector, name)).parameters)
            assert ours == theirs, (name, ours, theirs)
    # The hook itself acts on each of them: an override inherited from the NixlConnector
    # would pass every signature check and never run Boomerang's code (issue 12's bug).
    for name in ("request_finished_all_groups", "get_num_new_matched_tokens", "update_state_after_alloc"):
        assert name in vars(BoomerangConnectorMixin), f"the scheduler calls {name}; the hook does not override it"
    unknown = called - set(OVERRIDES) - set(LEFT_TO_NIXL)
    assert not unknown, f"vLLM's scheduler calls {sorted(unknown)}, which neither the hook nor the stand-in models"
    # The hook's calls were all made, each with arguments of the types the stand-in declares
    # (and so the types its unit tests pass): every argument of every call, on P and on D.
    assert {"get_num_new_matched_tokens", "update_state_after_alloc", "request_finished_all_groups", "shutdown"} <= rp.called() & rd.called()
    for recorder in (rp, rd):
        for name, args in recorder.calls:
            if name not in OVERRIDES:
                continue
            hints = typing.get_type_hints(getattr(vllm_standin.StandInNixlConnector, name))
            params = [p for p in inspect.signature(getattr(vllm_standin.StandInNixlConnector, name)).parameters
                      if p != "self"]
            assert len(args) == len(params), (name, args, params)
            for param, value in zip(params, args):
                assert conforms(value, hints[param]), (name, param, type(value), hints[param])
    (_, block_ids), *_ = rd.args("request_finished_all_groups")
    assert shape(block_ids) == shape(vllm_standin.block_ids_for(211, 16)), block_ids


def test_the_standin_returns_what_the_nixl_connector_returns(real: Any) -> None:
    _, _, p_real, d_real, _ = real
    p_ours, d_ours, _ = run_standin_turn()
    for theirs, ours in ((p_real, p_ours), (d_real, d_ours)):
        # The stand-in may leave out fields the hook never reads, never invent or reshape one.
        assert set(ours) <= set(theirs), set(ours) - set(theirs)
        for key in ours:
            assert shape(ours[key]) == shape(theirs[key]) or theirs[key] is None or ours[key] is None, \
                (key, ours[key], theirs[key])
    assert d_real["remote_num_tokens"] == 200 + 12 - 1  # all but the last sampled token have KV
    assert d_ours["remote_num_tokens"] == 200 + 12 - 1
    assert {k for k in d_real if k not in d_ours} <= {"remote_blocks_expiry_time"} | set(d_ours) | {
        "dcp_size", "pp_size", "remote_registration_generation", "transfer_mode", "tp_size"}


def test_the_standin_request_has_the_fields_the_hook_reads(real: Any) -> None:
    *_, request = real
    _, _, ours = run_standin_turn()
    for name in REQUEST_FIELDS:
        theirs_value, ours_value = getattr(request, name), getattr(ours, name)
        if name in ("prompt_token_ids", "all_token_ids"):
            assert isinstance(theirs_value, Sequence) and isinstance(ours_value, Sequence)
            assert all(isinstance(t, int) for t in theirs_value)
        elif name == "sampling_params":
            assert isinstance(getattr(theirs_value, "extra_args", None), dict)
        elif name == "kv_transfer_params":
            assert isinstance(theirs_value, dict) and isinstance(ours_value, dict)
        else:
            assert type(theirs_value) is type(ours_value), (name, theirs_value, ours_value)


def test_the_role_enum_names_the_scheduler_role() -> None:
    assert KVConnectorRole.SCHEDULER.name == vllm_standin.KVConnectorRole.SCHEDULER.name
