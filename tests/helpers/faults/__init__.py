"""Fault injection for tests: a loopback TCP proxy (:mod:`tests.helpers.faults.proxy`) and a
broker that advertises it (:mod:`tests.helpers.faults.kafka`)."""
