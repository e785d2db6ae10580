"""A failing handler's one-line error says where it failed: the last frames of its traceback."""

from __future__ import annotations

from pyharvest.errors import HandlerError
from pyharvest.inbox import InboxMessage


def charge(amount: int) -> int:
    return 100 // amount


def apply(_tx: object, message: InboxMessage) -> None:
    charge(0)


def test_the_error_names_the_handlers_innermost_frames():
    message = InboxMessage("payments", 0, 7, b"k", b"v", (), None, None, "d-1")
    try:
        apply(None, message)
    except ZeroDivisionError as e:
        error = HandlerError(message, e)
    text = str(error)
    assert text.startswith("handler failed on payments[0]@7 (delivery d-1): ZeroDivisionError: integer division")
    assert "(at test_handler_error.py:" in text and " in charge < test_handler_error.py:" in text
    assert text.index("in charge") < text.index("in apply")  # innermost first
    assert "\n" not in text
