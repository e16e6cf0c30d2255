"""The config's schema (src/filledfirst/schemas/config.schema.yaml, package data): each
key's type, bounds, description and default, read where a type holds that default
(filledfirst.study, and the config sections the contracts share with it)."""

from __future__ import annotations

import functools
from typing import Any

import yaml

from filledfirst.paths import SCHEMA_PATH


@functools.lru_cache(maxsize=1)
def config_schema() -> dict:
    """The whole schema, read once (shared: never modify it)."""
    return yaml.safe_load(SCHEMA_PATH.read_text())


def schema_property(*path: str) -> dict:
    """The schema's property at `path` (section, then key; "*" for any name of a catalog:
    `("experiments", "*", "share_server")`; a shared definition's: `("$defs", name, key)`):
    its type, bounds, default and description."""
    node: dict = config_schema()
    if path and path[0] == "$defs":
        node, path = node["$defs"][path[1]], path[2:]
    for key in path:
        node = node["additionalProperties"] if key == "*" else node["properties"][key]
    return node


def schema_default(*path: str) -> Any:
    """The `default:` of the schema's property at `path` (as in schema_property)."""
    node = schema_property(*path)
    if "default" not in node:
        raise KeyError(f"the schema gives {'.'.join(path)} no default")
    return node["default"]
