"""Serving gRPC: the server bootstrap, status translation and the health probe."""
