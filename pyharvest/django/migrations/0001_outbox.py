"""The outbox table named by ``settings.PYHARVEST_OUTBOX_TABLE`` (default ``outbox``), created
with the database's dialect plugin's DDL; reversed (``migrate pyharvest zero``), dropped."""

from typing import ClassVar

from django.db import migrations

from pyharvest.django.operations import CreateOutboxTable


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no type information
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[CreateOutboxTable]] = [CreateOutboxTable()]
