"""Store URLs: `cpu://?size=4GiB`, `file:///dir?size=20GiB`, `redis://host:port/db`.

`open_store(url)` parses, validates and opens; every mistake raises
ValueError naming the bad part of the URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from hybridkv.store.base import KVStore

DEFAULT_CPU_BYTES = 4 << 30
DEFAULT_FILE_BYTES = 20 << 30
DEFAULT_REDIS_PORT = 6379
SCHEMES = ("cpu", "file", "redis")
# query parameters each scheme accepts
_OPTIONS = {
    "cpu": {"size"},
    "file": {"size", "object_size", "shared"},
    "redis": {"timeout", "prefix", "shared"},
}
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 1 << 10, "m": 10**6, "mb": 10**6,
          "mib": 1 << 20, "g": 10**9, "gb": 10**9, "gib": 1 << 30, "t": 10**12, "tb": 10**12,
          "tib": 1 << 40}


def parse_size(text: str, what: str = "size") -> int:
    """Bytes in '4GiB', '512MiB', '20GB', '1.5GiB' or '1048576'.

    >>> parse_size("4GiB")
    4294967296
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"{what}: cannot read {text!r} as a size (e.g. 4GiB, 512MiB, 20GB)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"{what}: {text!r} is not a positive size")
    return value


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL (credentials kept out of `describe`)."""

    scheme: str
    path: str = ""
    host: str = ""
    port: int = 0
    db: int = 0
    options: dict[str, str] = field(default_factory=dict)
    username: str | None = None
    password: str | None = None

    def describe(self) -> str:
        if self.scheme == "redis":
            return f"redis://{self.host}:{self.port}/{self.db}"
        if self.scheme == "file":
            return f"file://{self.path}"
        return "cpu://"


def parse_store_url(url: str) -> StoreURL:
    """Split and check a store URL; ValueError names what is wrong."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"kv store URL must be a non-empty string, got {url!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"kv store URL {url!r}: unknown scheme {parts.scheme!r}; use one of "
                         f"cpu://?size=4GiB, file:///dir?size=20GiB, redis://host:port/db")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - _OPTIONS[scheme])
    if unknown:
        raise ValueError(f"kv store URL {url!r}: unknown option(s) {unknown} for {scheme}://; "
                         f"known: {sorted(_OPTIONS[scheme])}")
    if scheme == "cpu":
        if parts.netloc or parts.path not in ("", "/"):
            raise ValueError(f"kv store URL {url!r}: cpu:// takes no host or path, "
                             f"only ?size=")
        return StoreURL("cpu", options=options)
    if scheme == "file":
        return _file_url(url, parts, options)
    return _redis_url(url, parts, options)


def _file_url(url: str, parts, options: dict[str, str]) -> StoreURL:
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"kv store URL {url!r}: file:// takes a local directory, not host "
                         f"{parts.netloc!r} (write file:///abs/dir)")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise ValueError(f"kv store URL {url!r}: the directory must be absolute "
                         f"(file:///abs/dir)")
    return StoreURL("file", path=path, options=options)


def _redis_url(url: str, parts, options: dict[str, str]) -> StoreURL:
    try:
        host, port = parts.hostname or "127.0.0.1", parts.port or DEFAULT_REDIS_PORT
    except ValueError as e:
        raise ValueError(f"kv store URL {url!r}: bad port ({e})") from None
    db_text = parts.path.strip("/") or "0"
    if not db_text.isdigit():
        raise ValueError(f"kv store URL {url!r}: the database {db_text!r} must be a number "
                         f"(redis://host:port/0)")
    return StoreURL("redis", host=host, port=port, db=int(db_text), options=options,
                    username=parts.username, password=parts.password)


def open_store(url: str | KVStore) -> KVStore:
    """A store for `url`, or `url` itself when it already is a KVStore.

    A Redis store that cannot be reached at start is still returned: its
    calls fail with StoreError until the server answers.
    """
    if isinstance(url, KVStore):
        return url
    u = parse_store_url(url)
    shared = u.options.get("shared")
    flag = None if shared is None else parse_flag(shared, "shared")
    store = _open(u, bool(flag))
    if flag is not None:
        store.shared = flag
    return store


def parse_flag(text: str, what: str) -> bool:
    """'1'/'true'/'yes'/'on' or '0'/'false'/'no'/'off' (any case)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"kv store option {what}={text!r}: use 1 or 0")


def _open(u: StoreURL, shared: bool) -> KVStore:
    if u.scheme == "cpu":
        from hybridkv.store.cpu import CpuStore

        return CpuStore(parse_size(u.options.get("size", str(DEFAULT_CPU_BYTES)), "cpu size"))
    if u.scheme == "file":
        size = parse_size(u.options.get("size", str(DEFAULT_FILE_BYTES)), "file size")
        object_size = u.options.get("object_size")
        kwargs = {} if object_size is None else {
            "object_bytes": parse_size(object_size, "file object_size")}
        from hybridkv.store.file import FileStore

        return FileStore(u.path, size, shared=shared, **kwargs)
    timeout = u.options.get("timeout", "1.0")
    try:
        seconds = float(timeout)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"redis timeout must be a positive number of seconds, got {timeout!r}")
    from hybridkv.store.redis_store import RedisStore

    return RedisStore(u.host, u.port, u.db, timeout=seconds,
                      prefix=u.options.get("prefix", "hkv").encode(),
                      username=u.username, password=u.password)
