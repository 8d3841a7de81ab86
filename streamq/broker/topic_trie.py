"""A topic exchange's bindings as a trie of binding-key words, as RabbitMQ keeps them
(rabbit_exchange_type_topic's trie of edges and bindings).

Owns the lookup of the destinations whose binding key matches a routing key: a walk from
the root along the routing key's words, following at each node the edge of the word
itself, the `*` edge and the `#` edge (which takes zero or more words). Its cost depends
on the routing key's length and on the bindings that match along the way, not on how many
bindings the exchange holds: a scan of every binding's key on each publish whose routing
key was not in the route cache grew with the bindings (issue 30: every lookup on the
publish path O(1) or O(log n) whatever the traffic's shape; many distinct routing keys
miss any cache). Matching follows `exchange.topic_match`: `*` is exactly one word, an
empty word too, and `#` zero or more.

It knows nothing of exchanges, queues or messages: destinations are opaque hashables.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Final, Generic, TypeVar

ONE_WORD: Final = "*"
ANY_WORDS: Final = "#"
D = TypeVar("D", bound=Hashable)


class _Node(Generic[D]):
    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _Node[D]] = {}
        # Destination -> how many bindings with this key lead to it (the same destination
        # may be bound with the same key and different arguments).
        self.destinations: dict[D, int] = {}


class TopicTrie(Generic[D]):
    """Binding keys (as word lists) to destinations; `match` finds those of a routing key."""

    __slots__ = ("_root",)

    def __init__(self) -> None:
        self._root: _Node[D] = _Node()

    def add(self, pattern: Sequence[str], destination: D) -> None:
        node = self._root
        for word in pattern:
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node[D]()
            node = child
        node.destinations[destination] = node.destinations.get(destination, 0) + 1

    def remove(self, pattern: Sequence[str], destination: D) -> None:
        """Take one binding of `pattern` to `destination` away (no-op if none); nodes
        left with neither destinations nor children go too."""
        path = [self._root]
        for word in pattern:
            child = path[-1].children.get(word)
            if child is None:
                return
            path.append(child)
        node = path[-1]
        count = node.destinations.get(destination)
        if count is None:
            return
        if count > 1:
            node.destinations[destination] = count - 1
            return
        del node.destinations[destination]
        for depth in range(len(pattern), 0, -1):
            node = path[depth]
            if node.destinations or node.children:
                break
            del path[depth - 1].children[pattern[depth - 1]]

    def node_count(self) -> int:
        """How many nodes the trie holds, the root included."""
        count, stack = 0, [self._root]
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.children.values())
        return count

    def match(self, words: Sequence[str]) -> set[D]:
        """The destinations of every binding key that matches the routing key `words`."""
        out: set[D] = set()
        seen: set[tuple[int, int]] = set()  # (node id, words used): each state once
        stack = [(self._root, 0)]
        end = len(words)
        while stack:
            node, used = stack.pop()
            state = (id(node), used)
            if state in seen:
                continue
            seen.add(state)
            children = node.children
            if used == end:
                out.update(node.destinations)
            else:
                word = words[used]
                exact = children.get(word)
                if exact is not None:
                    stack.append((exact, used + 1))
                one = children.get(ONE_WORD)
                if one is not None:
                    stack.append((one, used + 1))
            many = children.get(ANY_WORDS)
            if many is not None:
                # `#` takes zero or more of the words left: one state per count.
                stack.extend((many, rest) for rest in range(used, end + 1))
        return out
