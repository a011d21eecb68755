"""Routing requests across serving instances by what their KV caches can reuse.

`PrefixIndex` keeps, from the instances' block events, which prefixes each
one can reuse under every group's rule; the policies in `policy` trade that
against load; `app` is the `hybridkv route` HTTP server.
"""

from hybridkv.serving.router.index import PrefixIndex, Reuse
from hybridkv.serving.router.layout import CacheLayout, ReuseClass, layout_json

__all__ = ["CacheLayout", "PrefixIndex", "ReuseClass", "Reuse", "layout_json"]
