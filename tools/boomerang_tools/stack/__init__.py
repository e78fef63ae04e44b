"""Everything at once for local use: `boomerang up` (and the demo) run each service as a child
process, with simulated engines and an embedded PostgreSQL when none is configured."""
