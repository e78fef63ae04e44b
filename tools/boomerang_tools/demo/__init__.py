"""`boomerang demo`: AWS's multi-turn experiment replayed on simulated engines, Boomerang off vs on."""
