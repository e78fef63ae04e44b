"""`BoomerangConnector`: vLLM's NixlConnector with Boomerang's hook, for `kv_connector_module_path`.

Load it with
`--kv-transfer-config '{"kv_connector": "BoomerangConnector",
"kv_connector_module_path": "boomerang_vllm_hook.connector", ...}'` (see README.md here).
The class exists only where vLLM is importable; everything it does lives in plain modules
(`mixin.py`, `hook.py`, …) that are tested without vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from boomerang_vllm_hook.mixin import BoomerangConnectorMixin

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
