"""The MP/R engine: one outbox or one shard of it (:mod:`.harvest`, whose invariants per-key
order rests on), the shards a process leads (:mod:`.sharded`), what both share (:mod:`.lifecycle`)
and the pause between empty marks (:mod:`.idle`)."""
