"""The engine simulator: a faithful model of a vLLM 0.33 OpenAI server running the
NixlConnector with `bidirectional_kv_xfer: true`, without GPUs. See `README.md` here.
"""
