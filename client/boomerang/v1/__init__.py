"""Generated protobuf and gRPC stubs for boomerang.v1 (run `make proto`)."""
