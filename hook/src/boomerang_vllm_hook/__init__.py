"""Boomerang's vLLM hook: a NixlConnector subclass that talks to the registry and router.

Import `boomerang_vllm_hook.connector` only inside vLLM; the rest of this package is plain
Python (see README.md in this folder).
"""
