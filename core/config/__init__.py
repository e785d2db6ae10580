"""Configuration: the harvester's settings and their defaults (:mod:`.settings`), the YAML
conventions they are read with (:mod:`.mapping`, :mod:`.yaml_files`, :mod:`.durations`), the
types they refuse when built (:mod:`.checks`), secrets masked in logs (:mod:`.masking`), and
which YAML key a Kafka property the client refused came from (:mod:`.kafka_origins`)."""
