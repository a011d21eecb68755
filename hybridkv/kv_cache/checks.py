"""The integer check every constructor and entry point shares: a bad value raises
ValueError naming the argument and the value."""

from __future__ import annotations


def check_int(name: str, value: object, minimum: int | None = None,
              maximum: int | None = None, note: str = "") -> int:
    """Return `value` if it is an int (a bool is not) in [minimum, maximum].

    Otherwise raise ValueError "`name` must be an int in [...]`note`, got
    `value`". Either bound may be None (unbounded).

    >>> check_int("block_size", 16, 1)
    16
    """
    if isinstance(value, bool) or not isinstance(value, int) \
            or (minimum is not None and value < minimum) \
            or (maximum is not None and value > maximum):
        if maximum is not None:
            bound = f" in [{minimum if minimum is not None else '-inf'}, {maximum}]"
        else:
            bound = f" >= {minimum}" if minimum is not None else ""
        raise ValueError(f"{name} must be an int{bound}{note}, got {value!r}")
    return value
