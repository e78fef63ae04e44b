"""The OpenAI-compatible gateway: Boomerang's front door, replacing vLLM's multi-turn proxy.

Per turn it tokenizes on a prefill engine, asks the router for a plan, sends the prefill
request with the plan's `kv_transfer_params`, streams the decode engine's tokens to the
client, and reports the turn (D's retained blocks) to the router after the last byte.
"""
