"""Boomerang services' shared library: settings, database, engine pool, gRPC serving."""
