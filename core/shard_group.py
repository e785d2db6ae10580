"""Where sharded Fast NELI lived before the single leader became its one-shard case; kept so
that existing imports work. Everything is in :mod:`pyharvest.core.neli`."""

from pyharvest.core.group_protocol import shard_client_configs
from pyharvest.core.neli import ShardConsumer, ShardGroup, ShardLease

__all__ = ["ShardConsumer", "ShardGroup", "ShardLease", "shard_client_configs"]
