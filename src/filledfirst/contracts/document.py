"""What the JSON contracts (run.json, a schedule's stats) share: a key a writer leaves out
is `UNSET` in the record it builds (msgspec omits it when encoding, so the file has no
such key), and None in every record a reader gets (`settled`), so readers test one value.
"""

from __future__ import annotations

from typing import Any, TypeVar, Union

import msgspec
from msgspec import UNSET, UnsetType

T = TypeVar("T")
# A key a writer may leave out: the value, null, or (when writing) absent.
Opt = Union[T, None, UnsetType]


class Document(msgspec.Struct, kw_only=True):
    """A record written as a JSON object; unknown keys are allowed, so a file from a newer
    writer still reads."""

    def to_doc(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


def settled(value: Any) -> Any:
    """`value` with every UNSET in it, however deep in records, as None: a record as
    readers see it."""
    if isinstance(value, msgspec.Struct):
        changes = {}
        for name in value.__struct_fields__:
            old = getattr(value, name)
            new = settled(old)
            if new is not old:
                changes[name] = new
        return msgspec.structs.replace(value, **changes) if changes else value
    if isinstance(value, list):
        items = [settled(v) for v in value]
        return items if any(a is not b for a, b in zip(items, value)) else value
    return None if value is UNSET else value
