"""`BoomerangConnector`: vLLM's NixlConnector with Boomerang's hook, for `kv_connector_module_path`.

Load it with
`--kv-transfer-config '{"kv_connector": "BoomerangConnector",
"kv_connector_module_path": "boomerang_vllm_hook.connector", ...}'` (see README.md here).
The class exists only where vLLM is importable; its overrides, `BoomerangConnectorMixin`,
are written against any NixlConnector-shaped base class and go before `NixlConnector` in its
bases. The tests do the same with a stand-in that follows docs/vllm-contract.md. Only the
scheduler-role instance (the one in vLLM's engine-core process) gets a hook (`hook.py`);
worker-role instances behave exactly like the NixlConnector.

The overrides follow the NixlConnector's signatures:
`get_num_new_matched_tokens(request, num_computed_tokens) -> (int | None, bool)`,
`update_state_after_alloc(request, blocks, num_external_tokens)`, and the two ways a
request's end reaches a connector:
`request_finished_all_groups(request, block_ids: tuple[list[int], ...])` for connectors
that support the hybrid KV-cache manager (`SupportsHMA`; vLLM 0.33.0's scheduler calls
this one on the NixlConnector, with or without `--disable-hybrid-kv-cache-manager`), and
`request_finished(request, block_ids: list[int])` for connectors without it. Every way a
request ends inside vLLM's scheduler (stopped, length-capped, aborted, or freed while
waiting) goes through one of them; preemption does not end a request (vLLM puts it back in
the waiting queue and asks `get_num_new_matched_tokens` again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from boomerang_vllm_hook.config import HookConfig, parse_config
from boomerang_vllm_hook.hook import BoomerangHook
from boomerang_vllm_hook.sender import EngineFacts, engine_facts

log = logging.getLogger("boomerang_vllm_hook")

def _role_name(role: Any) -> str:
    return str(getattr(role, "name", role)).upper()


class BoomerangConnectorMixin:
    """Boomerang's hook around the NixlConnector's scheduler-side calls."""

    boomerang: BoomerangHook | None = None  # the hook (scheduler role only)
    # How the hook is built; tests replace it to hand the hook their own clients.
    hook_factory: Callable[[HookConfig, EngineFacts], BoomerangHook] = BoomerangHook

    def __init__(self, vllm_config: Any, role: Any, *args: Any, **kwargs: Any):
        super().__init__(vllm_config, role, *args, **kwargs)  # type: ignore[call-arg]
        self.boomerang = None
        if _role_name(role) != "SCHEDULER":
            return
        extra = getattr(getattr(vllm_config, "kv_transfer_config", None), "kv_connector_extra_config", None)
        config = parse_config(extra)  # a bad configuration stops the engine here, with the keys named
        facts = engine_facts(vllm_config, config, getattr(self, "connector_scheduler", None))
        self.boomerang = type(self).hook_factory(config, facts)
        self.boomerang.start()
        log.info("boomerang: %s hook on engine %s (model %s)", facts.role, facts.engine_id, facts.model)

    def _guard(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:
            log.exception("boomerang: %s failed; the request continues without Boomerang", what)
            if self.boomerang is not None:
                self.boomerang.counters["hook_errors"] += 1
            return None

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        """Plan the turn (prefill engines), then let the NixlConnector count what to load.

        While the plan is in flight and worth waiting for, the answer is vLLM's "ask again
        later", `(None, False)`: the scheduler skips the request this step and goes on with
        the others, so it never waits on the network."""
        if self.boomerang is not None:
            ready = self._guard("planning", self.boomerang.before_match, request, num_computed_tokens)
            if ready is False:
                return None, False
        return super().get_num_new_matched_tokens(request, num_computed_tokens)  # type: ignore[misc, no-any-return]

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """The NixlConnector's allocation step, then note the handle is in use."""
        super().update_state_after_alloc(request, blocks, num_external_tokens)  # type: ignore[misc]
        if self.boomerang is not None:
            self._guard("after_alloc", self.boomerang.after_alloc, request, num_external_tokens)

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        """The end of a request on an HMA connector (the NixlConnector): the NixlConnector's
        result, registered (decode) or reported (prefill)."""
        result: tuple[bool, dict[str, Any] | None] = super().request_finished_all_groups(  # type: ignore[misc]
            request, block_ids
        )
        return self._finished(request, result)

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        """The end of a request on a connector without HMA support (same treatment)."""
        result: tuple[bool, dict[str, Any] | None] = super().request_finished(request, block_ids)  # type: ignore[misc]
        return self._finished(request, result)

    def _finished(self, request: Any, result: tuple[bool, dict[str, Any] | None]) -> tuple[bool, dict[str, Any] | None]:
        if self.boomerang is None:
            return result
        changed = self._guard("request_finished", self.boomerang.on_finished, request, result)
        return result if changed is None else changed

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        """Decode engines: released turns get their send deadline moved to now in the
        NixlConnector scheduler's `_reqs_need_send`, which this very call hands to the workers;
        their next `get_finished` frees the blocks (releases.py). Also samples free blocks."""
        if self.boomerang is not None and self.boomerang.facts.role == "decode":
            self._guard("releases", self._apply_releases)
        return super().build_connector_meta(scheduler_output)  # type: ignore[misc]

    def _apply_releases(self) -> None:
        inbox = self.boomerang.releases  # type: ignore[union-attr]
        manager = getattr(self, "_kv_cache_manager", None)  # bound by vLLM's scheduler
        pool = getattr(manager, "block_pool", None)
        if pool is not None:
            inbox.free_blocks = int(pool.get_num_free_blocks())
            inbox.total_blocks = int(getattr(pool, "num_gpu_blocks", 0) or 0)
        released = inbox.take()
        if not released:
            return
        need_send = getattr(getattr(self, "connector_scheduler", None), "_reqs_need_send", None)
        if not isinstance(need_send, dict):
            # vLLM changed the path this relies on; the blocks are freed at vLLM's TTL instead.
            inbox.counters["releases_unsupported"] += len(released)
            return
        now = time.perf_counter()
        for rid in released:
            need_send[rid] = now

    def update_connector_output(self, connector_output: Any) -> None:
        """The NixlConnector's, then forget turns vLLM freed (read by P, or reaped), and time
        the pulls that finished loading (prefill engines)."""
        parent = getattr(super(), "update_connector_output", None)
        if parent is not None:
            parent(connector_output)
        if self.boomerang is not None and getattr(connector_output, "finished_sending", None):
            self._guard("freed", self.boomerang.releases.freed, connector_output.finished_sending)
        if self.boomerang is not None and getattr(connector_output, "finished_recving", None):
            self._guard("loaded", self.boomerang.loaded, connector_output.finished_recving)

    def shutdown(self) -> None:
        """Flush the background senders briefly, then the NixlConnector's own shutdown."""
        if self.boomerang is not None:
            self._guard("shutdown", self.boomerang.close)
            self.boomerang = None
        parent = getattr(super(), "shutdown", None)
        if parent is not None:
            parent()


NixlConnector: Any = None
try:  # vLLM 0.33 keeps the NixlConnector in a package; older releases in one module.
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (  # type: ignore[import-not-found, no-redef]
        NixlConnector,
    )
except ImportError:  # pragma: no cover - depends on the installed vLLM
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector import (  # type: ignore[import-not-found, no-redef]
            NixlConnector,
        )
    except ImportError:
        NixlConnector = None

VLLM_AVAILABLE = NixlConnector is not None

if TYPE_CHECKING or VLLM_AVAILABLE:

    class BoomerangConnector(BoomerangConnectorMixin, NixlConnector):  # type: ignore[misc]
        """NixlConnector whose scheduler side registers retained turns and asks for plans."""

__all__ = ["VLLM_AVAILABLE", "BoomerangConnectorMixin"]
if VLLM_AVAILABLE:
    __all__ += ["BoomerangConnector"]
