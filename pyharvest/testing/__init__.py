"""Test support shipped with pyharvest: the dialect conformance suite (:mod:`.conformance`)."""
