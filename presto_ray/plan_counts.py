"""The last plan tree of a `PlanCache` (presto_ray/plan_cache.py) kept as counts and masses: the
cache's nodes, and the part of the cache that makes the counts, either by a whole walk from the
root (`_walk_all`) or by settling, depth by depth, the nodes whose branches, mass or membership
changed (`_update`; see `PlanCache`'s docstring)."""

from __future__ import annotations

from typing import cast

from presto_ray.plan_tree import _Expansion, _Facts, PlanRules, RequestKey
from presto_ray.schedule import Event
from presto_ray.selection import PlanNode

_UNDRESSED, _AS_EXPANDED, _AS_DEAD = 0, 1, 2  # how a node is dressed for the tree


class _CachedNode(PlanNode):
    """A plan node the cache keeps across trees, with what made it."""

    __slots__ = (
        "event", "facts", "expansion", "branch_nodes", "stale", "read_root", "look", "root_of", "at_root", "walk", "parents",
        "registered_with", "mass", "in_level", "counted", "contributes",
    )  # fmt: skip

    def __init__(self, event: Event, facts: _Facts) -> None:
        # PlanNode's fields at their defaults, set here: its generated __init__ costs a call per node
        self.depth, self.key, self.free, self.pending, self.value, self.cost, self.children = 0, None, False, False, 1.0, 1, []
        self.waits_for = None
        self.event = event
        self.facts = facts
        self.expansion: _Expansion | None = None
        self.branch_nodes: list[tuple[_CachedNode, float]] = []
        self.stale = True  # not expanded with the current knowledge
        self.read_root = False  # expanded as a node in the root's state
        self.look = _UNDRESSED
        self.root_of: _Facts | None = None  # the root `at_root` was found for
        self.at_root = False  # its facts are that root's
        # the rest is valid while `walk` is the cache's: the tree as that walk and the updates since see it
        self.walk = -1
        self.parents = 0  # branches of the tree that lead to this node (0: not in it)
        self.mass = 0  # the probability the walk reaches it, in MASS_SCALE units (sum over its branches)
        self.in_level = False  # in its depth's `_members`
        self.counted: _Expansion | None = None  # the expansion the tree's counts hold for it
        self.contributes: tuple[int, list[tuple[_CachedNode, float]]] | None = None  # (its mass, its branches): what its children hold from it
        self.registered_with: RequestKey | None = None  # the source in whose `_source_readers` it is (pending or dead)


# Masses are integers in these units, each branch's share truncated (`_share`): integer sums do not
# depend on their order, so a tree updated in place has exactly the masses of the tree built from
# nothing, and the same nodes fall below `min_reach`.
MASS_SCALE = 1 << 40


def _share(mass: int, p: float) -> int:
    return int(mass * p)


def _bump(counts: dict, key: object, sign: int) -> None:
    count = counts.get(key, 0) + sign
    if count:
        counts[key] = count
    else:
        del counts[key]


class TreeCounts:
    """The last tree as counts (`PlanCache`'s base): how many of its branches lead to each node and
    with what mass, its nodes per depth, and how many of its nodes need each key, are forks, are in
    the root's state, wait for each fork point."""

    _walk: int
    _last_depth: int
    _min_mass: int  # nodes the walk reaches with less mass are not expanded (MASS_SCALE units)
    _level_keyed: list[int]
    _members: list[dict[_CachedNode, None]]  # the tree's nodes at each depth (the one past the limit included)
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

    def _walk_all(self, root: _CachedNode, rules: PlanRules, last_event: int, max_keyed_depth: int, max_depth: int) -> None:
        """The tree from `root` counted afresh, level by level (a new root, rules or limits): each
        node met is dressed as this tree sees it, expanded first where stale, and counted in."""
        self._walk += 1
        walk = self._walk
        root_facts = root.facts
        self._root_facts = root_facts
        root_known = root_facts.known
        min_mass = self._min_mass
        key_nodes: dict[RequestKey, int] = {}
        fork_nodes: dict[RequestKey, int] = {}
        root_state_nodes: dict[RequestKey, int] = {}
        fork_needs: dict[RequestKey, dict[int, int]] = {}
        level_keyed = [0] * (max_depth + 2)
        members: list[dict[_CachedNode, None]] = [{} for _ in range(max_depth + 2)]
        requests_per_step = rules.requests_per_step
        root.walk, root.parents, root.mass = walk, 1, MASS_SCALE
        level: list[_CachedNode] = [root]
        keyed_depths = 0
        free_nodes = 0
        depth = 0
        while depth < max_depth and level and keyed_depths < max_keyed_depth:
            following: list[_CachedNode] = []
            keyed = 0
            members[depth] = dict.fromkeys(level)
            for node in level:
                node.depth, node.in_level, node.counted, node.contributes = depth, True, None, None
                mass = node.mass
                if mass < min_mass:  # too improbable to plan below
                    _dress_dead(node)
                    continue
                facts = node.facts
                if node.root_of is not root_facts:  # compared once per root
                    node.root_of = root_facts
                    node.at_root = facts is root_facts or (facts.whole_known and facts.known == root_known)
                at_root = node.at_root
                if node.stale or node.read_root is not at_root:
                    self._expand(node, rules, last_event, at_root)
                expansion = node.expansion
                if expansion is None:
                    _dress_dead(node)
                    continue
                node.counted = expansion
                key = expansion.key
                if node.look != _AS_EXPANDED:
                    node.key, node.free, node.pending, node.waits_for = key, expansion.free, expansion.pending, expansion.fork
                    node.value = 0.0 if expansion.free else 1.0
                    node.cost = requests_per_step if key is not None and not node.event.is_extension else 1
                    node.children = node.branch_nodes  # type: ignore[assignment]
                    node.look = _AS_EXPANDED
                if expansion.free:
                    free_nodes += 1
                if expansion.pending:
                    source, needed = expansion.fork  # type: ignore[misc]
                    needs = fork_needs.get(source)
                    if needs is None:
                        needs = fork_needs[source] = {}
                    needs[needed] = needs.get(needed, 0) + 1
                if key is not None:
                    if expansion.is_fork:
                        fork_nodes[key] = fork_nodes.get(key, 0) + 1
                    key_nodes[key] = key_nodes.get(key, 0) + 1
                    if at_root:
                        root_state_nodes[key] = root_state_nodes.get(key, 0) + 1
                    keyed += 1
                branches = node.branch_nodes
                for child, p in branches:
                    if child.walk != walk:
                        child.walk, child.parents, child.mass = walk, 1, _share(mass, p)
                        following.append(child)
                    else:
                        child.parents += 1
                        child.mass += _share(mass, p)
                node.contributes = (mass, branches)
            level_keyed[depth] = keyed
            keyed_depths += keyed > 0
            level = following
            depth += 1
        self._last_depth = depth - 1
        members[depth] = dict.fromkeys(level)
        for node in level:  # past the keyed-depth limit: dead in this tree
            node.depth, node.in_level, node.counted, node.contributes = depth, True, None, None
            _dress_dead(node)
        self._level_keyed, self._members = level_keyed, members
        self._key_nodes, self._fork_nodes, self._root_state_nodes, self._fork_needs = key_nodes, fork_nodes, root_state_nodes, fork_needs
        self._fork_points = None
        self._free_nodes = free_nodes

    def _update(self, stale: list[_CachedNode], max_keyed_depth: int, max_depth: int) -> None:
        """Bring the last tree up to date with the stale nodes re-expanded.

        A sweep by depth: a node whose branches or mass changed is settled once, after every node
        above it (edges go one depth down), and marks the children whose branches or mass it
        changed; the sweep stops where nothing changes. Then the keyed-depth limit is found again
        as a whole walk finds it; where it moved, the depth just past the shallower of the two
        limits is settled again (its nodes planned, or dead past the limit), until it stays."""
        walk = self._walk
        last_depth = self._last_depth
        dirty: dict[int, dict[_CachedNode, None]] = {}
        for node in stale:
            if node.walk == walk and node.parents > 0 and node.depth <= last_depth:
                level = dirty.get(node.depth)
                if level is None:
                    level = dirty[node.depth] = {}
                level[node] = None
        settle = self._settle
        members, level_keyed = self._members, self._level_keyed
        while True:
            while dirty:
                depth = min(dirty)
                below = dirty.get(depth + 1)
                if below is None:
                    below = dirty[depth + 1] = {}
                for node in dirty.pop(depth):
                    settle(node, below)
                if not below:
                    del dirty[depth + 1]
            # the limit: a depth is planned while fewer than max_keyed_depth depths above it have keys
            keyed_depths, depth = 0, 0
            while depth < max_depth and members[depth] and keyed_depths < max_keyed_depth:
                keyed_depths += level_keyed[depth] > 0
                depth += 1
            if depth - 1 == self._last_depth:
                return
            changed = min(depth - 1, self._last_depth) + 1
            self._last_depth = depth - 1
            dirty = {changed: dict.fromkeys(members[changed])}

    def _count(self, node: _CachedNode, expansion: _Expansion, sign: int) -> None:
        """Count an expanded node of the tree in (+1) or out (-1)."""
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

    def _settle(self, node: _CachedNode, below: dict[_CachedNode, None]) -> None:
        """Bring one node of the sweep's depth up to date (its membership, mass, expansion and
        counts) and its children's branches from it; `below`: the next depth's nodes to settle."""
        in_tree = node.parents > 0
        depth = node.depth
        if in_tree != node.in_level:
            node.in_level = in_tree
            if in_tree:
                self._members[depth][node] = None
            else:
                del self._members[depth][node]
        mass = node.mass
        live = in_tree and depth <= self._last_depth and mass >= self._min_mass
        if live:
            root_facts = self._root_facts
            if node.root_of is not root_facts:
                node.root_of = root_facts
                facts = node.facts
                node.at_root = facts is root_facts or (facts.whole_known and facts.known == root_facts.known)  # type: ignore[union-attr]
            expand = node.stale or node.read_root is not node.at_root
            old = node.contributes
            if not expand and old is not None:  # the same branches and counts
                old_mass, branches = old
                if old_mass != mass:  # its children's masses move by their shares' difference
                    for child, p in branches:
                        moved = _share(mass, p) - _share(old_mass, p)
                        if moved:
                            child.mass += moved
                            below[child] = None
                    node.contributes = (mass, branches)
                return
        else:
            expand = False
        counted = node.counted
        if counted is not None:
            node.counted = None
            key = counted.key
            if counted.free or counted.pending:
                self._count(node, counted, -1)
            else:  # keyed, the common case, inlined: `_count`'s operations
                self._level_keyed[depth] -= 1
                _drop(self._key_nodes, key)
                if counted.is_fork:
                    _drop(self._fork_nodes, key)
                if node.at_root:
                    _drop(self._root_state_nodes, key)
        old = node.contributes
        if old is not None:
            node.contributes = None
            old_mass, branches = old
            for child, p in branches:
                child.parents -= 1
                child.mass -= int(old_mass * p)  # _share, inlined
                below[child] = None
        if not live:
            _dress_dead(node)
            return
        if expand:
            self._expand(node, self._rules, self._last_event, node.at_root)  # type: ignore[arg-type]
        expansion = node.expansion
        if expansion is None:
            _dress_dead(node)
            return
        if node.look != _AS_EXPANDED:
            key = expansion.key
            node.key, node.free, node.pending, node.waits_for = key, expansion.free, expansion.pending, expansion.fork
            node.value = 0.0 if expansion.free else 1.0
            node.cost = self._rules.requests_per_step if key is not None and not node.event.is_extension else 1  # type: ignore[union-attr]
            node.children = node.branch_nodes  # type: ignore[assignment]
            node.look = _AS_EXPANDED
        if expansion.free or expansion.pending:
            self._count(node, expansion, 1)
        else:  # keyed, the common case, inlined: `_count`'s operations
            key = cast(RequestKey, expansion.key)
            self._level_keyed[depth] += 1
            counts = self._key_nodes
            counts[key] = counts.get(key, 0) + 1
            if expansion.is_fork:
                counts = self._fork_nodes
                counts[key] = counts.get(key, 0) + 1
            if node.at_root:
                counts = self._root_state_nodes
                counts[key] = counts.get(key, 0) + 1
        node.counted = expansion
        walk = self._walk
        branches = node.branch_nodes
        for child, p in branches:
            if child.walk != walk:  # first met since the last whole walk: not in the tree
                child.walk, child.parents, child.mass, child.depth = walk, 0, 0, depth + 1
                child.in_level, child.counted, child.contributes = False, None, None
            child.parents += 1
            child.mass += int(mass * p)  # _share, inlined
            below[child] = None
        node.contributes = (mass, branches)


def _drop(counts: dict, key: object) -> None:
    count = counts[key] - 1
    if count:
        counts[key] = count
    else:
        del counts[key]


def _dress_dead(node: _CachedNode) -> None:
    if node.look != _AS_DEAD:
        node.key, node.free, node.pending, node.value, node.cost, node.children = None, False, False, 1.0, 1, []
        node.waits_for = None
        node.look = _AS_DEAD


