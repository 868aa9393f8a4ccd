"""The last plan tree of a `PlanCache` (presto_ray/plan_cache.py) kept as counts, and updated
where knowledge changed: the cache's nodes, and the part of the cache that counts re-expanded
nodes' new children in and their old ones out (see `PlanCache`'s docstring)."""

from __future__ import annotations

from presto_ray.plan_tree import _Expansion, _Facts, PlanRules, RequestKey
from presto_ray.schedule import Event
from presto_ray.selection import PlanNode

_UNDRESSED, _AS_EXPANDED, _AS_DEAD = 0, 1, 2  # how a node is dressed for the tree


class _CachedNode(PlanNode):
    """A plan node the cache keeps across trees, with what made it."""

    __slots__ = ("event", "facts", "expansion", "branch_nodes", "stale", "read_root", "look", "root_of", "at_root", "walk", "parents", "registered_with")

    def __init__(self, event: Event, facts: _Facts) -> None:
        # PlanNode's fields at their defaults, set here: its generated __init__ costs a call per node
        self.depth, self.key, self.free, self.pending, self.value, self.cost, self.children = 0, None, False, False, 1.0, 1, []
        self.waits_for = None
        self.event = event
        self.facts = facts
        self.expansion: _Expansion | None = None
        self.branch_nodes: list[tuple[PlanNode, float]] = []
        self.stale = True  # not expanded with the current knowledge
        self.read_root = False  # expanded as a node in the root's state
        self.look = _UNDRESSED
        self.root_of: _Facts | None = None  # the root `at_root` was found for
        self.at_root = False  # its facts are that root's
        self.walk = -1  # the walk whose `parents` count is valid
        self.parents = 0  # branches of that walk's tree that lead to this node (0: not in it)
        self.registered_with: RequestKey | None = None  # the source in whose `_source_readers` it is (pending or dead)


def _bump(counts: dict, key: object, sign: int) -> None:
    count = counts.get(key, 0) + sign
    if count:
        counts[key] = count
    else:
        del counts[key]


class TreeCounts:
    """The last tree as counts (`PlanCache`'s base): how many of its branches lead to each node,
    its nodes per depth, and how many of its nodes need each key, are forks, are in the root's
    state, wait for each fork point."""

    _walk: int
    _last_depth: int
    _level_nodes: list[int]
    _level_keyed: list[int]
    _key_nodes: dict[RequestKey, int]
    _fork_nodes: dict[RequestKey, int]
    _root_state_nodes: dict[RequestKey, int]
    _fork_needs: dict[RequestKey, dict[int, int]]
    _fork_points: dict[RequestKey, int] | None
    _free_nodes: int
    _root_facts: _Facts | None
    _rules: PlanRules | None
    _last_event: int

    def _expand(self, node: _CachedNode, rules: PlanRules, last_event: int, at_root: bool) -> None:
        raise NotImplementedError  # the cache's

    def _update(self, stale: list[_CachedNode], max_keyed_depth: int, max_depth: int) -> bool:
        """Bring the last tree's counts up to date with the stale nodes re-expanded; False when
        the keyed-depth limit moved (the caller walks the whole tree)."""
        walk = self._walk
        last_depth = self._last_depth
        in_tree = [node for node in stale if node.walk == walk and node.parents > 0 and node.depth <= last_depth]
        if in_tree:
            in_tree.sort(key=_depth_of)
            for node in in_tree:
                if node.stale and node.parents > 0:  # not left, nor re-entered, since
                    self._reexpand(node)
        # where the limit now falls: the walk processes a depth while fewer than max_keyed_depth
        # depths above it have keys
        level_nodes, level_keyed = self._level_nodes, self._level_keyed
        keyed_depths, depth = 0, 0
        while depth < max_depth and level_nodes[depth] and keyed_depths < max_keyed_depth:
            keyed_depths += level_keyed[depth] > 0
            depth += 1
        return depth - 1 == last_depth

    def _count(self, node: _CachedNode, sign: int) -> None:
        """Count an expanded node of the tree in (+1) or out (-1)."""
        expansion = node.expansion
        assert expansion is not None
        if expansion.free:
            self._free_nodes += sign
        if expansion.pending:
            source, needed = expansion.fork  # type: ignore[misc]
            self._fork_points = None
            needs = self._fork_needs.get(source)
            if needs is None:
                needs = self._fork_needs[source] = {}
            _bump(needs, needed, sign)
            if not needs:
                del self._fork_needs[source]
        key = expansion.key
        if key is not None:
            self._level_keyed[node.depth] += sign
            _bump(self._key_nodes, key, sign)
            if expansion.is_fork:
                _bump(self._fork_nodes, key, sign)
            if node.at_root:
                _bump(self._root_state_nodes, key, sign)

    def _dress(self, node: _CachedNode) -> None:
        expansion = node.expansion
        assert expansion is not None
        if node.look != _AS_EXPANDED:
            key = expansion.key
            node.key, node.free, node.pending, node.waits_for = key, expansion.free, expansion.pending, expansion.fork
            node.value = 0.0 if expansion.free else 1.0
            node.cost = self._rules.requests_per_step if key is not None and not node.event.is_extension else 1  # type: ignore[union-attr]
            node.children = node.branch_nodes
            node.look = _AS_EXPANDED

    def _reexpand(self, node: _CachedNode) -> None:
        old = node.branch_nodes if node.expansion is not None else []
        if node.expansion is not None:
            self._count(node, -1)
        self._expand(node, self._rules, self._last_event, node.at_root)  # type: ignore[arg-type]
        if node.expansion is None:
            _dress_dead(node)
        else:
            self._dress(node)
            self._count(node, 1)
            enter = self._enter
            depth = node.depth + 1
            for child, _ in node.branch_nodes:
                enter(child, depth)  # type: ignore[arg-type]
        leave = self._leave
        for child, _ in old:
            leave(child)  # type: ignore[arg-type]

    # `_enter` and `_leave` run for every node an update moves in or out of the tree (hundreds
    # per event): `_count` and `_dress` are inlined there, the common case (a keyed node that is
    # neither free nor pending) first; the same operations as theirs.
    def _enter(self, node: _CachedNode, depth: int) -> None:
        """One more branch of the tree leads to `node`."""
        if node.walk != self._walk:
            node.walk, node.parents = self._walk, 1
        else:
            node.parents += 1
            if node.parents > 1:
                return
        node.depth = depth
        self._level_nodes[depth] += 1
        if depth > self._last_depth:
            _dress_dead(node)
            return
        root_facts = self._root_facts
        if node.root_of is not root_facts:
            node.root_of = root_facts
            facts = node.facts
            node.at_root = facts is root_facts or (facts.whole_known and facts.known == root_facts.known)  # type: ignore[union-attr]
        if node.stale or node.read_root is not node.at_root:
            self._expand(node, self._rules, self._last_event, node.at_root)  # type: ignore[arg-type]
        expansion = node.expansion
        if expansion is None:
            _dress_dead(node)
            return
        key = expansion.key
        if node.look != _AS_EXPANDED:
            node.key, node.free, node.pending, node.waits_for = key, expansion.free, expansion.pending, expansion.fork
            node.value = 0.0 if expansion.free else 1.0
            node.cost = self._rules.requests_per_step if key is not None and not node.event.is_extension else 1  # type: ignore[union-attr]
            node.children = node.branch_nodes
            node.look = _AS_EXPANDED
        if expansion.free or expansion.pending:
            self._count(node, 1)
        elif key is not None:
            self._level_keyed[depth] += 1
            counts = self._key_nodes
            counts[key] = counts.get(key, 0) + 1
            if expansion.is_fork:
                counts = self._fork_nodes
                counts[key] = counts.get(key, 0) + 1
            if node.at_root:
                counts = self._root_state_nodes
                counts[key] = counts.get(key, 0) + 1
        enter = self._enter
        depth += 1
        for child, _ in node.branch_nodes:
            enter(child, depth)  # type: ignore[arg-type]

    def _leave(self, node: _CachedNode) -> None:
        """One branch fewer of the tree leads to `node`."""
        node.parents -= 1
        if node.parents:
            return
        depth = node.depth
        self._level_nodes[depth] -= 1
        expansion = node.expansion
        if depth > self._last_depth or expansion is None:
            return
        key = expansion.key
        if expansion.free or expansion.pending:
            self._count(node, -1)
        elif key is not None:
            self._level_keyed[depth] -= 1
            _drop(self._key_nodes, key)
            if expansion.is_fork:
                _drop(self._fork_nodes, key)
            if node.at_root:
                _drop(self._root_state_nodes, key)
        leave = self._leave
        for child, _ in node.branch_nodes:
            leave(child)  # type: ignore[arg-type]


def _drop(counts: dict, key: object) -> None:
    count = counts[key] - 1
    if count:
        counts[key] = count
    else:
        del counts[key]


def _depth_of(node: _CachedNode) -> int:
    return node.depth


def _dress_dead(node: _CachedNode) -> None:
    if node.look != _AS_DEAD:
        node.key, node.free, node.pending, node.value, node.cost, node.children = None, False, False, 1.0, 1, []
        node.waits_for = None
        node.look = _AS_DEAD


