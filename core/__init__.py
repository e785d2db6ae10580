"""The engine: the MP/R harvester (:mod:`.engine`), its delivery modes (:mod:`.publishing`),
Fast NELI leader election (:mod:`.election`), configuration (:mod:`.config`), the outbox record
(:mod:`.outbox`), what it reports (:mod:`.telemetry`), when a stuck Kafka client is replaced
(:mod:`.healing`) and the inbox's engine (:mod:`.inbox`).

Nothing here imports a database driver, SQLAlchemy or a Kafka client: the engine talks to the
world through the protocols of :mod:`.ports`, which :mod:`pyharvest.bindings` implements. What
an application uses is exported by :mod:`pyharvest` and its public modules, each name from one
place; these modules are where it is written.
"""
