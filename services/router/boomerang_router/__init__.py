"""The router: verified KV-reuse plans and engine choice for each turn (RouterService)."""
