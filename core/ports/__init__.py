"""The protocols the engine talks through: a database (:mod:`.database`) and Kafka's clients
(:mod:`.kafka`). The bindings implement them; the engine never sees a driver or a client."""
