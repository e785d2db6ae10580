"""Leader election: Fast NELI on Kafka's group protocol (:mod:`.neli`), its heartbeats
(:mod:`.heartbeats`), and the leader group's client settings under each group protocol
(:mod:`.group_protocol`)."""
