"""One engine pool for the router and the gateway: the engine record, static specs, the
registry's snapshot, health, and who may serve (model, role).

`table` holds the engines and their availability, free of gRPC; `refresh` reads the block
registry's `ListEngines` into a table. Each service adds its own choice on top: the router
ranks by reported and planned load (`boomerang_router.engines`); the gateway probes static
engines' `/v1/models`, vouches for them in the registry and falls back to the least busy or
a conversation's hash (`boomerang_gateway.engine_routing`).
"""
