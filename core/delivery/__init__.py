"""How marked records reach Kafka and leave the table: the delivery mode the engine talks
to, at least once (the per-key gate, the dispatcher, the sender, the delivery processor), and
what both modes do with failures (:mod:`.failures`, :mod:`.poison_hints`)."""
