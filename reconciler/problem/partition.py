"""Keys joined into groups pair by pair (union-find, path halving): the problem's independent parts
(decompose) and the rooms of a tenant's stopped jobs that share an instance (plancheck)."""

from __future__ import annotations


class Partition:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def __contains__(self, key: str) -> bool:
        return key in self.parent

    def find(self, key: str) -> str:
        """The key standing for key's group (key joins as a group of its own if new)."""
        parent = self.parent
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    def union(self, a: str, b: str) -> None:
        """a's group joins b's (b's representative stands for both)."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb
