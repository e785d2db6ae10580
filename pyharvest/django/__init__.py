"""pyharvest for Django: the outbox table as a migration, stashing inside
``transaction.atomic()`` on Django's own connection, and ``manage.py reaper``.

.. code-block:: python

    INSTALLED_APPS = [..., "pyharvest.django"]     # app label "pyharvest"
    PYHARVEST_OUTBOX_TABLE = "outbox"              # the default

    from django.db import transaction
    from pyharvest import OutboxRecord
    from pyharvest.django import stash

    with transaction.atomic():
        order = Order.objects.create(...)
        stash(OutboxRecord("orders", key=str(order.pk), value=b"..."))

``python manage.py migrate pyharvest`` creates the table with the dialect plugin's DDL;
``python manage.py reaper`` runs the harvester on the database in ``DATABASES``.
"""

from pyharvest.django.databases import data_source
from pyharvest.django.stasher import stash, stash_many

__all__ = ["data_source", "stash", "stash_many"]
