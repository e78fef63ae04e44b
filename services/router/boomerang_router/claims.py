"""Claims the router holds but will not hand out, given back to the registry in the background.

A claim is given back (ReleaseClaim) when the router decides against pulling after it
claimed, when the caller went away before the answer, and when a claim call timed out but
may still have committed. For the last, an orphan probe re-asks ClaimReuse under the same
claim id with an unreachable `min_reusable_tokens`: that can only return the earlier claim
(CLAIM_SQL's `prior`), never take a new one. It releases what it finds only while no plan
holds the claim, because a claim id derived from a caller's request id is shared by that
caller's retries, here or on another replica.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

from boomerang.clients.base import BoomerangClientError
from boomerang.resilience import TRANSIENT_CODES

from boomerang_router.plans import PlanStore
from boomerang_router.registry_api import ClaimRequest, RouterRegistry
from boomerang_router.repository import TurnPlanRepository
from boomerang_router.settings import RouterSettings

log = logging.getLogger(__name__)

ORPHAN_PROBE_DELAYS = (1.0, 4.0, 15.0)
MAX_ORPHAN_PROBES = 256


class ClaimKeeper:
    """Background releases and orphan probes, with bounded concurrency."""

    def __init__(
        self,
        settings: RouterSettings,
        registry: RouterRegistry,
        store: PlanStore,
        repo: TurnPlanRepository,
        stats: Counter[str],
    ):
        self.settings = settings
        self.registry = registry
        self.store = store
        self.repo = repo
        self.stats = stats
        self.tasks: set[asyncio.Task[Any]] = set()
        self._orphan_probes = 0

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` in the background; its failure is logged, never raised."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background claim task failed", exc_info=task.exception())

    async def release(self, tenant: str, lease_id: str, claim_id: str, reason: str, attempts: int = 3) -> bool:
        """ReleaseClaim, retried while the registry is unreachable; whether it was released."""
        for attempt in range(attempts):
            try:
                await self.registry.release_claim(
                    tenant, lease_id, claim_id, reason, timeout=self.settings.report_timeout_seconds
                )
                self.stats["claims_released"] += 1
                return True
            except BoomerangClientError as err:
                if err.code not in TRANSIENT_CODES:
                    log.warning("could not release claim on lease %s: %s", lease_id, err)
                    return False
                await asyncio.sleep(0.2 * 2**attempt)
        log.warning("gave up releasing claim on lease %s; it stays claimed until it expires", lease_id)
        self.stats["claims_release_failed"] += 1
        return False

    def probe_orphan(self, claim: ClaimRequest) -> None:
        """Start an orphan probe for a claim call that failed or timed out (bounded in number)."""
        if self._orphan_probes >= MAX_ORPHAN_PROBES:
            self.stats["orphan_probes_skipped"] += 1
            return
        self.spawn(self._counted(claim))

    async def _counted(self, claim: ClaimRequest) -> None:
        self._orphan_probes += 1
        try:
            await self.orphan_probe(claim)
        finally:
            self._orphan_probes -= 1

    async def orphan_probe(self, claim: ClaimRequest) -> None:
        """A timed-out claim may still commit: find it under its id and give it back.

        Only while no plan holds it: a claim id derived from a caller's request id is shared
        by that caller's retries, and a retry (here or on another replica) may have been
        handed this very claim. Plans that hand a claim out are in this router's store or
        in `turn_plans`; when neither can be checked, the claim is left to expire.
        """
        since = datetime.now(UTC) - timedelta(hours=1)
        for delay in ORPHAN_PROBE_DELAYS:
            await asyncio.sleep(delay)
            try:
                lease_id = await self.registry.find_claim(claim, timeout=self.settings.report_timeout_seconds)
            except BoomerangClientError:
                continue
            if lease_id is None:
                continue
            if self.store.by_claim(claim.claim_id) is not None:
                self.stats["orphan_claims_in_use"] += 1
                return
            try:
                held = await self.repo.claim_handed_out(claim.tenant, claim.conversation_id, claim.claim_id, since)
            except Exception:
                log.warning("cannot check whether claim %s is in use; leaving it", claim.claim_id, exc_info=True)
                self.stats["orphan_claims_unchecked"] += 1
                return
            if held:
                self.stats["orphan_claims_in_use"] += 1
                return
            self.stats["orphan_claims_found"] += 1
            await self.release(claim.tenant, lease_id, claim.claim_id, "ROUTER_CLAIM_TIMED_OUT")
            return

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait (bounded) for background releases; orphan probes still sleeping are cancelled."""
        if not self.tasks:
            return
        _, pending = await asyncio.wait(list(self.tasks), timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
