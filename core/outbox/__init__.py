"""What an outbox row is: the record (:mod:`.records`), its stored header format
(:mod:`.headers`), the identity headers the harvester stamps (:mod:`.identity`), and the key
hash that puts it in a shard (:mod:`.keys`)."""
