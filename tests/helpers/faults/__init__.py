"""Fault injection for tests: a loopback TCP proxy (:mod:`tests.faults.proxy`) and a
broker that advertises it (:mod:`tests.faults.kafka`)."""
