"""The campaign's agents: conversations that each send a turn, wait for the reply, think, and go on.

An agent reaches the gateways as a client behind a load balancer would. The balancer probes each
gateway's `/health` every half second and sends a turn to a ready one drawn at random: one that
answers, with at least one model (what `boomerang up` and the tests wait for; a gateway started
while the registry cannot list the engines knows none and answers 503 `no_engine`). If the
chosen one refuses the connection (it went down since the probe), the turn goes to the other;
with none ready it waits. A turn that fails is sent again (the same history) until it succeeds or
the run ends; every attempt is recorded, with its wall-clock start and end, so the checks can
tell a failure a fault explains (its gateway or an engine killed under it) from one it does not.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

# Turns in one session of an agent (about 5,700 tokens by its end); then it starts a new
# conversation. Unbounded, 10 minutes of turns grew each conversation past 14,000 tokens and
# the decode engines' pinned, unread turns filled their pools (the engine refused with 503).
SESSION_TURNS = 60

MODEL = "Qwen/Qwen3-32B"


@dataclass
class Attempt:
    """One HTTP attempt at a turn."""

    conversation: str
    turn: int
    gateway: str
    started: float
    ended: float = 0.0
    status: int = 0  # 0: no HTTP answer
    plan: str = ""
    plan_id: str = ""
    request_id: str = ""
    error: str = ""
    refused: bool = False  # the connection was refused: nothing reached the gateway

    @property
    def ok(self) -> bool:
        """Whether the turn was served."""
        return self.status == 200 and not self.error


@dataclass
class Agents:
    """`count` conversations against `gateways` (base URLs), seeded."""

    gateways: list[str]
    count: int
    seed: int
    attempts: list[Attempt] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    ready: set[str] = field(default_factory=set)  # the balancer's view
    # One connection pool per gateway, replaced when the gateway stops answering its probe: as a
    # balancer drops its connections to a backend that failed, so none is reused with a restart.
    clients: dict[str, httpx.AsyncClient] = field(default_factory=dict)
    _retired: list[httpx.AsyncClient] = field(default_factory=list)

    def _client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.count * 2, max_keepalive_connections=self.count)
        return httpx.AsyncClient(timeout=httpx.Timeout(60, connect=3), limits=limits)

    async def run(self) -> None:
        """Every agent until `stop` is set (each finishes the turn it is in)."""
        self.clients = {g: self._client() for g in self.gateways}
        probing = asyncio.create_task(self._probe())
        try:
            await asyncio.gather(*(self._agent(n) for n in range(self.count)))
        finally:
            probing.cancel()
            for client in [*self.clients.values(), *self._retired]:
                await client.aclose()

    async def _probe(self) -> None:
        async with httpx.AsyncClient(timeout=1.0) as http:
            while True:
                for gateway in self.gateways:
                    try:
                        resp = await http.get(gateway + "/health")
                        ok = resp.status_code == 200 and int(resp.json().get("models", 0)) >= 1
                    except (httpx.HTTPError, ValueError, TypeError):
                        ok = False
                    if ok:
                        self.ready.add(gateway)
                    elif gateway in self.ready:
                        self.ready.discard(gateway)
                        # Its requests in flight finish on the old pool; new ones open new connections.
                        self._retired.append(self.clients[gateway])
                        self.clients[gateway] = self._client()
                await asyncio.sleep(0.5)

    async def _agent(self, n: int) -> None:
        rng = random.Random(f"{self.seed}-{n}")
        await asyncio.sleep(rng.uniform(0, 3))  # not all at once
        turn = 0
        while not self.stop.is_set():
            if turn % SESSION_TURNS == 0:  # a new session: a new conversation from its system prompt
                conversation = f"chaos-{self.seed}-{n}" + (f"-{turn // SESSION_TURNS}" if turn else "")
                history: list[dict[str, str]] = [
                    {"role": "system", "content": f"Agent {n}. " + "Read the file, plan the edit, run the tests. " * 30}]
            history.append({"role": "user", "content": f"Step {turn}: " + "look at the next failing test. " * 6})
            while True:
                reply = await self._attempt(rng, conversation, turn, history)
                if reply is not None or self.stop.is_set():
                    break
                await asyncio.sleep(0.5)
            if reply is None:
                return
            history.append({"role": "assistant", "content": reply})
            turn += 1
            try:
                await asyncio.wait_for(self.stop.wait(), rng.uniform(0.5, 2.5))  # the agent's tool runs
            except TimeoutError:
                pass

    async def _attempt(self, rng: random.Random, conversation: str, turn: int,
                       history: list[dict[str, str]]) -> str | None:
        ready = [g for g in self.gateways if g in self.ready]
        if not ready:
            return None  # no gateway is up: the agent waits
        first = rng.randrange(len(ready))
        body: dict[str, Any] = {"model": MODEL, "messages": history, "max_tokens": 12, "conversation_id": conversation}
        for k in range(len(ready)):
            gateway = ready[(first + k) % len(ready)]
            attempt = Attempt(conversation, turn, gateway, time.time())
            self.attempts.append(attempt)
            try:
                resp = await self.clients[gateway].post(gateway + "/v1/chat/completions", json=body)
                attempt.status = resp.status_code
                attempt.plan = resp.headers.get("x-boomerang-plan", "")
                attempt.plan_id = resp.headers.get("x-boomerang-plan-id", "")
                attempt.request_id = resp.headers.get("x-request-id", "")
                if resp.status_code != 200:
                    attempt.error = resp.text[:300]
                    return None
                content: str = resp.json()["choices"][0]["message"]["content"]
                return content
            except httpx.ConnectError as exc:
                attempt.refused, attempt.error = True, repr(exc)
                continue  # that gateway is down: the other one
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                attempt.error = repr(exc)
                return None
            finally:
                attempt.ended = time.time()
        return None
