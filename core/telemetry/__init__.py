"""What the engine reports: events (:mod:`.events`), metrics (:mod:`.metrics`), health
(:mod:`.health`), its log lines (:mod:`.logs`) and a lasting failure's lines collapsed
(:mod:`.repeats`)."""
