"""Publishing: how marked records reach Kafka and are settled in the database, in one of two
delivery modes that share one middle (:mod:`~pyharvest.core.publishing.settlement`).

The engine builds the mode ``config.delivery`` names through
:func:`pyharvest.core.publishing.modes.delivery_mode`; what it asks of a mode is
:mod:`~pyharvest.core.publishing.contract`.
"""
