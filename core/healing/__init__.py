"""The heal: when a Kafka client that stays alive but makes no progress is replaced
(:mod:`.stuck_clients`). A policy the bindings apply to the clients they hand the engine, with
a probe's thread of its own; not a port (the ports are protocols, and this is behaviour), and
not telemetry (which only reports: the count of clients replaced is
:mod:`pyharvest.core.telemetry.client_restarts`)."""
