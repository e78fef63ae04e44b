"""`boomerang replay`: replay recorded conversations against an OpenAI-compatible endpoint and
compare time to first token with KV reuse off and on, by context length."""
