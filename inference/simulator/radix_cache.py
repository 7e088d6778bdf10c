"""A server's prefix cache: SGLang's radix cache, reduced to what decides a prefill's cost.

A radix tree of token-id sequences (the prompts a server prefilled, and each finished request's prompt
and output, as SGLang's `cache_unfinished_req` / `cache_finished_req` insert them). A prompt's cached
part is its longest prefix in the tree. The tree is bounded by a number of tokens; above it, the least
recently used leaves go first (SGLang's default `--radix-eviction-policy lru`), a whole node at a time,
so a conversation's shared history outlives the branches that hang off it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence


class _Node:
    __slots__ = ("children", "key", "last_access", "parent")

    def __init__(self, key: tuple[int, ...], parent: _Node | None, last_access: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.last_access = last_access


def _common_length(edge: tuple[int, ...], ids: Sequence[int], start: int) -> int:
    """How many leading tokens of `edge` equal `ids[start:]`."""
    limit = min(len(edge), len(ids) - start)
    length = 0
    while length < limit and edge[length] == ids[start + length]:
        length += 1
    return length


class RadixCache:
    """Token prefixes a server holds, at most `capacity_tokens` of them after each `evict`."""

    def __init__(self) -> None:
        self._clock = itertools.count(1)
        self._root = _Node((), None, 0)
        self.size_tokens = 0

    def match_prefix(self, ids: Sequence[int]) -> int:
        """The number of leading tokens of `ids` the cache holds; the nodes on the way are touched."""
        now = next(self._clock)
        node, matched = self._root, 0
        while matched < len(ids):
            child = node.children.get(ids[matched])
            if child is None:
                break
            length = _common_length(child.key, ids, matched)
            child.last_access = now
            matched += length
            if length < len(child.key):
                break
            node = child
        return matched

    def insert(self, ids: Sequence[int]) -> None:
        """Hold every prefix of `ids` (splitting an edge where `ids` leaves it)."""
        now = next(self._clock)
        node, position = self._root, 0
        while position < len(ids):
            child = node.children.get(ids[position])
            if child is None:
                leaf = _Node(tuple(ids[position:]), node, now)
                node.children[ids[position]] = leaf
                self.size_tokens += len(leaf.key)
                return
            length = _common_length(child.key, ids, position)
            if length < len(child.key):
                child = self._split(child, length)
            child.last_access = now
            position += length
            node = child

    def evict(self, capacity_tokens: int) -> None:
        """Drop least recently used leaves until at most `capacity_tokens` are held."""
        if self.size_tokens <= capacity_tokens:
            return
        leaves = [(leaf.last_access, id(leaf), leaf) for leaf in self._leaves()]
        heapq.heapify(leaves)
        while self.size_tokens > capacity_tokens and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None  # the root is never a leaf on the heap
            del parent.children[leaf.key[0]]
            self.size_tokens -= len(leaf.key)
            if parent is not self._root and not parent.children:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))

    def clear(self) -> None:
        self._root = _Node((), None, 0)
        self.size_tokens = 0

    def _split(self, child: _Node, length: int) -> _Node:
        """Cut `child`'s edge after `length` tokens; return the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = _Node(child.key[:length], parent, child.last_access)
        parent.children[upper.key[0]] = upper
        child.key = child.key[length:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    def _leaves(self) -> list[_Node]:
        leaves, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                leaves.append(node)
        return leaves
