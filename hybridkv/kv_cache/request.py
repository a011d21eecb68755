"""A request as the KV cache manager sees it: tokens, keys, progress."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hybridkv.kv_cache.checks import check_int
from hybridkv.kv_cache.fastpath import RequestCore, native
from hybridkv.kv_cache.hashing import BlockHasher, MultiModalItem, check_mm_items, check_token_ids

if TYPE_CHECKING:
    RequestBase = RequestCore
else:
    RequestBase = native.RequestCore if native is not None else RequestCore


class Request(RequestBase):
    """Token ids of one request and how many of them have KV/state in place.

    `num_computed_tokens` follows vLLM's scheduler convention: the caller adds
    the tokens a step computed after the step; after `free` the request
    starts again from 0. Block hashes are computed lazily by the manager and
    extended as tokens are appended.

    `vocab_size`: when given, prompt token ids must be below it (an engine
    passes its model's). Raises ValueError for an empty or non-string id, an
    empty prompt, token ids that are not ints in [0, 2**32) (or [0,
    vocab_size)), or malformed keys.
    """

    __slots__ = ("cache_salt", "lora_name", "mm_hashes", "max_tokens")

    # __init__: RequestCore's (a str id and a list or tuple of token ids, no keys, in C
    # when built), which calls this for any other call (and to raise):
    def _init_checked(self, request_id: str, prompt_token_ids: Sequence[int], *,
                      cache_salt: str | bytes | None = None, lora_name: str | None = None,
                      mm_hashes: Sequence[MultiModalItem] | None = None,
                      max_tokens: int | None = None, vocab_size: int | None = None) -> None:
        """Request(request_id, prompt_token_ids, *, cache_salt=None, lora_name=None,
        mm_hashes=None, max_tokens=None, vocab_size=None), checked."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if type(prompt_token_ids) is not list and (isinstance(prompt_token_ids, str | bytes)
                                                   or not isinstance(prompt_token_ids, Sequence)):
            raise ValueError(f"prompt_token_ids must be a sequence of ints, "
                             f"got {type(prompt_token_ids).__name__}")
        if len(prompt_token_ids) == 0:
            raise ValueError(f"request {request_id!r}: prompt_token_ids must not be empty")
        self.all_token_ids = list(prompt_token_ids)  # the prompt, then the output
        check_token_ids(self.all_token_ids, vocab_size)
        if cache_salt is not None and not isinstance(cache_salt, str | bytes):
            raise ValueError(f"cache_salt must be str or bytes, got {type(cache_salt).__name__}")
        if lora_name is not None and not isinstance(lora_name, str):
            raise ValueError(f"lora_name must be str, got {type(lora_name).__name__}")
        if max_tokens is not None:
            check_int("max_tokens", max_tokens, 1)
        self.request_id = request_id
        self.num_prompt_tokens = len(self.all_token_ids)
        self.num_computed_tokens = 0
        self.cache_salt = cache_salt
        self.lora_name = lora_name
        self.mm_hashes = check_mm_items(mm_hashes)
        self.max_tokens = max_tokens
        self.hasher: BlockHasher | None = None

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.all_token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    # append_output_token_ids: RequestCore (one decoded token at C speed), else:
    def _append_checked(self, token_ids: int | Sequence[int]) -> None:
        """Append token(s) of any other shape, checked (ValueError, appending nothing)."""
        if isinstance(token_ids, str | bytes) or not isinstance(token_ids, Sequence):
            token_ids = [token_ids]  # type: ignore[list-item]
        token_ids = list(token_ids)
        check_token_ids(token_ids)
        self.all_token_ids.extend(int(t) for t in token_ids)

    def block_hashes(self, hash_algo: str, block_size: int) -> list[bytes]:
        """Hashes of every full block so far (computed once, then extended)."""
        hasher = self.hasher
        if hasher is None or hasher.block_size != block_size or hasher.hash_algo != hash_algo:
            hasher = self.hasher = BlockHasher(hash_algo, block_size, memo=True,
                                               cache_salt=self.cache_salt,
                                               lora_name=self.lora_name, mm_items=self.mm_hashes)
        return hasher.extend(self.all_token_ids)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, num_tokens={self.num_tokens}, "
                f"num_computed_tokens={self.num_computed_tokens})")
