"""The topic exchange's trie of binding keys (`streamq/broker/topic_trie.py`): the same
answers as matching every binding key in turn (`exchange.topic_match`, checked against
RabbitMQ's own cases in test_topic_routing.py), a lookup that follows only the edges of
the routing key's words, and unbinds that take their nodes away again."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamq.broker.exchange import Destination, Exchange, topic_match, topic_words
from streamq.broker.topic_trie import TopicTrie

WORDS = st.sampled_from(["", "a", "b", "*", "#"])
KEYS = st.lists(WORDS, max_size=5).map(".".join)


@given(st.lists(KEYS, max_size=8), st.lists(KEYS, min_size=1, max_size=8))
def test_the_trie_matches_as_every_binding_in_turn(patterns: list[str], keys: list[str]) -> None:
    trie: TopicTrie[int] = TopicTrie()
    for index, pattern in enumerate(patterns):
        trie.add(topic_words(pattern), index)
    for key in keys:
        words = topic_words(key)
        expected = {i for i, p in enumerate(patterns) if topic_match(topic_words(p), words)}
        assert trie.match(words) == expected, (patterns, key)


@given(st.lists(KEYS, min_size=1, max_size=8), st.data())
def test_removing_bindings_leaves_the_others_and_prunes_nodes(
    patterns: list[str], data: st.DataObject
) -> None:
    trie: TopicTrie[int] = TopicTrie()
    for index, pattern in enumerate(patterns):
        trie.add(topic_words(pattern), index)
    gone = data.draw(st.sets(st.sampled_from(range(len(patterns)))))
    for index in gone:
        trie.remove(topic_words(patterns[index]), index)
    kept = [i for i in range(len(patterns)) if i not in gone]
    rebuilt: TopicTrie[int] = TopicTrie()
    for index in kept:
        rebuilt.add(topic_words(patterns[index]), index)
    assert trie.node_count() == rebuilt.node_count()
    for key in patterns:
        assert trie.match(topic_words(key)) == rebuilt.match(topic_words(key))


def test_a_destination_bound_twice_with_one_key_stays_until_both_go() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add(["a", "*"], "q")
    trie.add(["a", "*"], "q")
    trie.remove(["a", "*"], "q")
    assert trie.match(["a", "b"]) == {"q"}
    trie.remove(["a", "*"], "q")
    assert trie.match(["a", "b"]) == set()
    assert trie.node_count() == 1  # the root alone


def test_a_lookup_walks_only_its_own_words_among_many_bindings() -> None:
    # 10,000 bindings under distinct first words: a key's lookup finds its own in a
    # trie whose root fans out to all of them, without visiting the others' nodes.
    trie: TopicTrie[int] = TopicTrie()
    for user in range(10_000):
        trie.add(["user", str(user), "event"], user)
    trie.add(["user", "*", "event"], -1)
    trie.add(["#", "event"], -2)
    assert trie.match(["user", "4711", "event"]) == {4711, -1, -2}
    assert trie.match(["user", "4711", "other"]) == set()
    assert trie.node_count() == 1 + 1 + 10_000 * 2 + 2 + 2  # root, user, ids, *, #


def test_exchange_unbinds_keep_routing_consistent() -> None:
    exchange = Exchange("t", "topic", False, False, False, {})
    one, two = Destination("queue", "one"), Destination("queue", "two")
    exchange.bind(one, "a.*", {})
    exchange.bind(one, "a.*", {"x": 1})  # same key, other arguments: a second binding
    exchange.bind(two, "a.#", {})
    routed: set[Destination] = set()
    exchange.route("a.b", None, routed)
    assert routed == {one, two}
    exchange.unbind(one, "a.*", {})
    routed.clear()
    exchange.route("a.b", None, routed)
    assert routed == {one, two}  # the binding with arguments still routes
    exchange.unbind_destination(one)
    routed.clear()
    exchange.route("a.b", None, routed)
    assert routed == {two}


def test_direct_unbinds_count_bindings_per_key_and_destination() -> None:
    exchange = Exchange("d", "direct", False, False, False, {})
    queue = Destination("queue", "q")
    exchange.bind(queue, "k", {})
    exchange.bind(queue, "k", {"x": 1})
    exchange.unbind(queue, "k", {})
    routed: set[Destination] = set()
    exchange.route("k", None, routed)
    assert routed == {queue}
    exchange.unbind(queue, "k", {"x": 1})
    routed.clear()
    exchange.route("k", None, routed)
    assert routed == set()
