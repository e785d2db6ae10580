import json

from django.db import transaction

from pyharvest import OutboxRecord
from pyharvest.django import stash

from .models import Order


def place_order(customer: str, total_cents: int) -> Order:
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total_cents=total_cents)
        event = {"order": order.pk, "customer": customer, "total_cents": total_cents}
        stash(OutboxRecord("orders", key=str(order.pk), value=json.dumps(event).encode()))
        if total_cents <= 0:
            raise ValueError("an order must cost something")  # rolls back the order and its record
    return order
