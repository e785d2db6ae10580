"""The inbox tests' helpers: fakes of Kafka and the stores on SQLite (:mod:`.fakes`), producing
messages and building configs (:mod:`.tools`), and the handlers the ``reaper inbox`` processes
of the tests load by name (:mod:`.chain_handler`, :mod:`.batch_handler`)."""
