"""Exactly-once delivery (``delivery: exactly-once``): the window the main loop hands marked
records to (:mod:`.window`), the publisher's thread that runs Kafka transactions
(:mod:`.publisher`), and the progress record (:mod:`.progress`)."""
