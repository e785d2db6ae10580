"""The inbox's engine: Kafka messages applied to a database exactly once, behind ports.

The message a handler receives and its identities (:mod:`.message`); what the engine needs
of the world (:mod:`.ports`: a Kafka consumer, a database, the stores of checkpoints,
identities and dead letters); the engine's parts (:mod:`.engine` wires them: :mod:`.loop`,
:mod:`.partitions`, :mod:`.batch`, :mod:`.bisection`, :mod:`.recovery`, :mod:`.replay`,
:mod:`.stats`); what it stores instead of applying (:mod:`.letters`); its errors
(:mod:`.errors`). The SQL side is :mod:`pyharvest.bindings.sql.inbox`, the Kafka consumer
:mod:`pyharvest.bindings.kafka.inbox_consumer`, and :mod:`pyharvest.inbox` builds both from a
configuration."""
