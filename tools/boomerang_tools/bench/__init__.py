"""`boomerang bench`: measure Boomerang's own cost on the time-to-first-token path.

Starts the services on Postgres (embedded unless `BOOMERANG_DATABASE_URL` is set, then a
fresh scratch database on that server), preloads live leases straight into Postgres shaped
exactly as registrations write them, drives open-loop load from several client processes,
runs vLLM's example proxy as a naive baseline beside the gateway, and writes
`bench-report.json` plus a Markdown summary. See README "Performance".
"""
