"""The inbox's database side, in SQLAlchemy Core: its tables (:mod:`.tables`), the fenced
checkpoints (:mod:`.checkpoints`), dead letters and parked messages (:mod:`.deadletters`) and
the identities applied (:mod:`.dedupe`)."""
