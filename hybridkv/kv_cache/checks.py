"""The value checks every constructor and entry point shares: a bad value raises
ValueError naming the argument and the value. Integers (`check_int`) and
byte sizes typed by people (`parse_bytes`, `format_bytes`)."""

from __future__ import annotations

import re

# SI prefixes are decimal (GB = 10**9 bytes), IEC prefixes binary (GiB = 2**30 bytes)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


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


def parse_bytes(text: str, name: str = "--memory") -> int:
    """'40GB' -> 40 * 10**9, '40GiB' -> 40 * 2**30, '1e9' -> bytes; ValueError naming
    `name` and the text.

    Units are case-insensitive; SI units (kB, MB, GB, TB) are decimal and IEC
    units (KiB, MiB, GiB, TiB) binary, so 40GB is 37.25 GiB.

    >>> parse_bytes("1.5KiB")
    1536
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{name} {text!r} is not a size like 40GB (decimal) or 40GiB "
                         f"(binary); units: kB MB GB TB KiB MiB GiB TiB")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ValueError(f"{name} {text!r} must be positive")
    return value


def format_bytes(num_bytes: int) -> str:
    """'40.00 GB (37.25 GiB)': both unit systems, so neither is mistaken for the other."""
    return f"{num_bytes / 10**9:,.2f} GB ({num_bytes / 2**30:,.2f} GiB)"
