"""The `boomerang` command line: the composition root that puts the services and tools together."""
