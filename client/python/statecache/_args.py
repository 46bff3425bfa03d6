"""Client-side argument checks: each raises InvalidArgument naming the
argument (and the client method in `method`) before any RPC is made."""
from __future__ import annotations

import numbers
from typing import Any, List, Optional, Sequence

from statecache.errors import InvalidArgument
from statecache.types import PrefixKey, SlotHandle


def integer(x: Any, name: str, method: str = "", *, minimum: Optional[int] = None) -> int:
    """x as an int (Python or numpy integer, not bool) >= minimum."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise InvalidArgument(f"{name}: {x!r} is not an integer", method)
    x = int(x)
    if minimum is not None and x < minimum:
        raise InvalidArgument(f"{name}: {x} is below {minimum}", method)
    return x


def string(x: Any, name: str, method: str = "", *, required: bool = True) -> str:
    if not isinstance(x, str):
        raise InvalidArgument(f"{name}: {x!r} is not a str", method)
    if required and not x:
        raise InvalidArgument(f"{name}: empty", method)
    return x


def slot(x: Any, name: str, method: str = "") -> SlotHandle:
    if not isinstance(x, SlotHandle):
        raise InvalidArgument(f"{name}: {x!r} is not a SlotHandle (allocate_slots returns them)",
                              method)
    return x


def slots(xs: Any, name: str, method: str = "") -> List[SlotHandle]:
    if isinstance(xs, (SlotHandle, str, bytes)) or not isinstance(xs, Sequence):
        raise InvalidArgument(f"{name}: {xs!r} is not a sequence of SlotHandle", method)
    return [slot(x, f"{name}[{i}]", method) for i, x in enumerate(xs)]


def key(x: Any, name: str, method: str = "") -> PrefixKey:
    if not isinstance(x, PrefixKey):
        raise InvalidArgument(f"{name}: {x!r} is not a PrefixKey", method)
    return x


def one_of(method: str, **given: Any) -> str:
    """The name of the only argument that is not None (InvalidArgument unless
    exactly one is)."""
    set_ = [n for n, v in given.items() if v is not None]
    if len(set_) != 1:
        raise InvalidArgument(f"give exactly one of {', '.join(given)}", method)
    return set_[0]
