"""Paged KV-cache block manager with a prefix cache.

A full block's key chains its parent's key with its own tokens (and a salt naming the model),
so only a true prefix can match; a hit also compares the stored tokens and parent key, so a hash
collision can never hand out wrong KV. Freed blocks that hold cached content stay reusable until
they are evicted, least recently used first."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from engine.core.request import Request


@dataclass(eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    key: int | None = None
    parent_key: int | None = None
    tokens: tuple[int, ...] | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, salt: str = ""):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # key -> block id
        self.root_key = hash(("kestrel-prefix-root", salt))
        self.prefix_queries = 0  # tokens looked up in the prefix cache
        self.prefix_hits = 0  # tokens found there

    # -- capacity -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache ---------------------------------------------------------------------
    def _key(self, parent: int, tokens: tuple[int, ...]) -> int:
        return hash((parent, tokens))

    def match_prefix(self, req: Request) -> list[int]:
        """Blocks already holding a prefix of the request's tokens (at least one token is left to compute)."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        tokens = req.all_token_ids
        parent = self.root_key
        hits: list[int] = []
        for i in range((len(tokens) - 1) // bs):
            chunk = tuple(tokens[i * bs:(i + 1) * bs])
            bid = self.cached.get(self._key(parent, chunk))
            if bid is None:
                break
            blk = self.blocks[bid]
            if blk.tokens != chunk or blk.parent_key != parent:
                break
            hits.append(bid)
            parent = blk.key
        return hits

    # -- allocation -----------------------------------------------------------------------
    def allocate(self, req: Request, num_new_tokens: int, hits: list[int] = ()) -> bool:
        """Make the request's blocks cover its computed tokens, the prefix hits and num_new_tokens more.
        Returns False (changing nothing) when there are not enough free blocks."""
        if not hits:  # the common case (every decode, every later chunk): often no new block at all
            need = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size) - len(req.block_ids)
            if need <= 0:
                return True
            if need > len(self.free):
                return False
            self._take(req, need)
            return True
        have = len(req.block_ids) + len(hits)
        total = req.num_computed_tokens + len(hits) * self.block_size + num_new_tokens
        need = max(0, self.blocks_needed(total) - have)
        reclaimable = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        if need > len(self.free) - reclaimable:
            return False
        for bid in hits:
            blk = self.blocks[bid]
            if blk.ref_count == 0:
                del self.free[bid]
            blk.ref_count += 1
            req.block_keys.append(blk.key)
        req.block_ids.extend(hits)
        n = len(hits) * self.block_size
        req.num_computed_tokens += n
        req.num_cached_tokens += n
        self._take(req, need)
        return True

    def _take(self, req: Request, need: int) -> None:
        """Give the request ``need`` blocks from the free list's head (evicting their cached content)."""
        for _ in range(need):
            bid, _ = self.free.popitem(last=False)
            blk = self.blocks[bid]
            if blk.key is not None:
                if self.cached.get(blk.key) == bid:
                    del self.cached[blk.key]
                blk.key = blk.parent_key = blk.tokens = None
            blk.ref_count = 1
            req.block_ids.append(bid)

    def record_lookup(self, num_tokens: int, num_hit: int) -> None:
        self.prefix_queries += num_tokens
        self.prefix_hits += num_hit

    def cache_full_blocks(self, req: Request) -> None:
        """Register the request's newly computed full blocks in the prefix cache."""
        bs = self.block_size
        if not self.enable_prefix_caching or len(req.block_keys) >= req.num_computed_tokens // bs:
            return  # no block filled up since the last call (a decode fills one every block_size steps)
        full = min(req.num_computed_tokens // bs, len(req.block_ids))
        tokens = None
        while len(req.block_keys) < full:
            i = len(req.block_keys)
            tokens = tokens or req.all_token_ids
            parent = req.block_keys[-1] if req.block_keys else self.root_key
            chunk = tuple(tokens[i * bs:(i + 1) * bs])
            key = self._key(parent, chunk)
            blk = self.blocks[req.block_ids[i]]
            if blk.key is None and key not in self.cached:
                blk.key, blk.parent_key, blk.tokens = key, parent, chunk
                self.cached[key] = blk.block_id
            req.block_keys.append(key)

    def free_request(self, req: Request) -> None:
        """Release the request's blocks (tail first, so the tail is evicted first)."""
        for bid in reversed(req.block_ids):
            blk = self.blocks[bid]
            blk.ref_count -= 1
            if blk.ref_count == 0:
                if blk.key is None:
                    self.free[bid] = None
                    self.free.move_to_end(bid, last=False)  # no content worth keeping: reuse first
                else:
                    self.free[bid] = None
        req.block_ids = []
        req.block_keys = []
        req.num_computed_tokens = 0

    def reset_prefix_cache(self) -> None:
        for blk in self.blocks:
            if blk.ref_count == 0:
                blk.key = blk.parent_key = blk.tokens = None
        self.cached = {k: b for k, b in self.cached.items() if self.blocks[b].key == k}
