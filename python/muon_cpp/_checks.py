"""Argument checks of the Python wrappers: a ValueError naming the argument
and its value (at most 80 characters of it) before the call reaches C++."""
import numbers
import operator

import torch

INT64 = (-2**63, 2**63 - 1)


def short(value, limit=80):
    """repr(value), at most `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def number(where, name, value, integer=False):
    """``value`` as a float (or, with ``integer``, an int in int64), or
    ValueError "<where>: <name> must be a real number (an integer), got ...".
    Ranges are the C++ function's to check."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if not isinstance(value, bool):
        if integer and isinstance(value, numbers.Integral):
            v = operator.index(value)
            if INT64[0] <= v <= INT64[1]:
                return v
        elif not integer and isinstance(value, numbers.Real):
            return float(value)
    what = "an integer in int64" if integer else "a real number"
    raise ValueError(f"{where}: {name} must be {what}, got {short(value)} of type "
                     f"{type(value).__name__}")
