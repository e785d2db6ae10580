"""The inbox's engine types, below the bindings that implement its ports: the message a
handler receives and its identities (:mod:`.message`), what the inbox needs of a Kafka consumer
(:mod:`.ports`), and its base error (:mod:`.errors`). The inbox itself (its transactions over
SQLAlchemy) is :mod:`pyharvest.inbox`; its Kafka consumer is
:mod:`pyharvest.bindings.kafka.inbox_consumer`."""
