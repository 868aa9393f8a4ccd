"""The planning trees of a streaming chain, kept and updated across its events (`PlanCache`), and
a tree built from nothing (`build_plan_tree`: a fresh cache's tree). The tree's rules are
presto_ray/plan_tree.py.

Incremental (`PlanCache`): a streaming chain plans at every event, and an event changes the
knowledge of one request, or moves the root one step down the tree. A node is a pure function of
(its event, its facts, the knowledge of its own request, whether it is in the root's state), so
the cache keeps one node object per (event, facts) across trees, re-expands only the nodes whose
request's knowledge changed since they were expanded, and a tree is a walk over the kept nodes
from the root, level by level, that dresses each node as this tree sees it (levels past the
keyed-depth limit, and nodes the walk reaches with less than `min_reach`, are dead). The trees
are exactly the ones a build from nothing gives: tests/test_plan_cache.py compares them node for
node at every event. The nodes, and the last tree kept as counts and updated in place:
presto_ray/plan_counts.py.
"""

from __future__ import annotations

from typing import Callable, Iterable

from presto_ray.schedule import Event, Schedule
from presto_ray.plan_counts import _UNDRESSED, MASS_SCALE, _CachedNode, TreeCounts
from presto_ray.plan_tree import TokenRun, _Facts, PlanTree, PlanRules, RequestKey, ProposalKnowledge, StoppedEarly, MAX_PLAN_DEPTH


# the token count a dead node with a source waits for: none (only a source that starts, ends or
# changes re-expands it, never one that grows)
_NEVER_GROWN = 1 << 62


# A cache holding more nodes than this many times its last tree's (superseded knowledge leaves
# nodes no tree reaches again) starts afresh: memory stays bounded on long chains.
MAX_STORED_PER_TREE_NODE = 8
MIN_STORED_NODES = 4096


class PlanCache(TreeCounts):
    """The nodes of a chain's trees, by (event index, facts), kept while what they read stays:
    `version` (the predictor's fits), `depends_on` (compared by identity: the state, when cuts
    depend on more than its length), the deepest plannable event, and the knowledge of each
    node's own request (changed knowledge re-expands the nodes that read it). Nodes of events
    the walk has passed are dropped as it moves.

    The last tree is kept as counts: how many of its branches lead to each node (a node is in it
    while some do) and the probability the walk reaches it (its mass, an exact integer), its nodes
    per depth, and how many of its nodes need each key, are forks, are in the root's state, wait
    for each fork point. A node reached with less than `min_reach` is not expanded (the walk will
    almost never pass it; 37% of the toy job's nodes were below 0.01). A tree from the same root
    is that tree updated where knowledge changed, depth by depth (`TreeCounts._update`): a
    re-expanded node's new children are counted in with their masses, its old ones out; a node
    whose mass changed passes the change to its children; a node that enters is expanded, one no
    branch leads to leaves; and where the keyed-depth limit moves, the depth past it is settled
    again. A new root walks the whole tree."""

    def __init__(self) -> None:
        self._version: tuple[int, object, int] | None = None
        self._event_index = 0
        self._nodes: dict[int, dict[_Facts, _CachedNode]] = {}  # event index -> facts -> node
        self._readers: dict[RequestKey, set[_CachedNode]] = {}  # request -> nodes that need it (read whether it runs or ended)
        # request -> pending nodes waiting for its tokens -> the token count each waits for
        self._source_readers: dict[RequestKey, dict[_CachedNode, int]] = {}
        self._sourced: dict[RequestKey, list[_CachedNode]] = {}  # request -> the nodes whose facts name it as their source
        self._events: dict[int, Event] = {}
        self._proposal: dict[RequestKey, tuple[tuple[int, ...], bool]] = {}
        self._stopped: frozenset[RequestKey] = frozenset()
        self._stored = 0  # nodes created since the cache last started afresh
        self._root_tokens: tuple[object, TokenRun] = (None, TokenRun(()))  # the state's tokens, as a TokenRun
        self._last_tree_nodes = 0
        self._newly_stale: list[_CachedNode] = []
        # the last tree, as counts (see the class's docstring); `_walk` stamps the nodes' counts
        self._walk = 0
        self._walked: tuple[object, ...] | None = None  # (root, rules, max_keyed_depth, max_depth, min_mass) of the last tree
        self._last_depth = -1  # the deepest depth whose nodes are expanded; the next one's are dead
        self._min_mass = 0
        self._members: list[dict[_CachedNode, None]] = []
        self._level_keyed: list[int] = []
        self._key_nodes: dict[RequestKey, int] = {}
        self._fork_nodes: dict[RequestKey, int] = {}
        self._root_state_nodes: dict[RequestKey, int] = {}
        self._fork_needs: dict[RequestKey, dict[int, int]] = {}  # source -> token count -> nodes
        self._fork_points: dict[RequestKey, int] | None = None  # the trees' fork points, while `_fork_needs` stays
        self._free_nodes = 0
        self._root_facts: _Facts | None = None
        self._rules: PlanRules | None = None
        self._last_event = 0

    def _sync(self, event_index: int, version: tuple[int, object, int]) -> bool:
        """Drop what the new version or event index invalidates; True: started afresh."""
        old = self._version
        too_many = self._stored > max(MIN_STORED_NODES, MAX_STORED_PER_TREE_NODE * self._last_tree_nodes)
        afresh = False
        if old is None or old[0] != version[0] or old[1] is not version[1] or old[2] != version[2] or too_many:
            self._version, self._nodes, self._readers, self._events, self._stored = version, {}, {}, {}, 0
            self._source_readers, self._sourced = {}, {}
            self._proposal, self._stopped = {}, frozenset()  # no node read them
            self._walked, afresh = None, True
        elif event_index != self._event_index:
            for passed in [e for e in self._nodes if e < event_index]:
                del self._nodes[passed]
            for key in [key for key in self._readers if key[0] < event_index]:
                del self._readers[key]
            for key in [key for key in self._source_readers if key[0] < event_index]:
                del self._source_readers[key]
            for key in [key for key in self._sourced if key[0] < event_index]:
                del self._sourced[key]
        self._event_index = event_index
        return afresh

    def _learn(
        self, proposal: ProposalKnowledge | None, stopped_early: StoppedEarly | None, changed_keys: Iterable[RequestKey] | None
    ) -> None:
        """Mark stale the nodes whose request's knowledge changed since the last tree: of every
        request, or of `changed_keys` only (the caller's word that no other request's changed)."""
        stopped = frozenset(stopped_early) if stopped_early else frozenset()
        before = self._proposal
        now: dict[RequestKey, tuple[tuple[int, ...], bool]]
        if changed_keys is None:
            now = dict(proposal) if proposal else {}
            keys: Iterable[RequestKey] = [*now, *(key for key in before if key not in now)]
        else:
            now = before  # brought up to date key by key below
            keys = changed_keys
        # a proposal that only grew changes nothing for the nodes that need it (their accept
        # child names it as its source), only for the pending nodes waiting for its tokens
        grown = []
        changed = []
        started = []
        for key in keys:
            old = before.get(key)
            info = proposal.get(key) if proposal else None
            if old == info:
                continue
            if info is None:  # no longer running nor finished
                changed.append(key)
                if not old[1]:  # type: ignore[index]
                    self._forget_source(key)
            elif old is None and not info[1]:
                # the facts below its accept edge stay (plan_tree._accepted): only the nodes
                # that wait for its tokens change
                started.append(key)
            elif old is not None and not old[1] and not info[1] and info[0][: len(old[0])] == old[0]:
                grown.append(key)
            else:
                changed.append(key)
                if old is None or not old[1]:
                    if info[1]:
                        self._finish_source(key, info[0])
                    else:
                        self._forget_source(key)
            if changed_keys is not None:
                if info is None:
                    del now[key]
                else:
                    now[key] = info
        changed += list(stopped ^ self._stopped)
        newly_stale = self._newly_stale
        readers, source_readers = self._readers, self._source_readers
        for key in changed:
            for node in readers.get(key, ()):
                if not node.stale:
                    node.stale = True
                    newly_stale.append(node)
        for key in changed + started:
            for node in source_readers.get(key, ()):
                if not node.stale:
                    node.stale = True
                    newly_stale.append(node)
        for key in grown:  # a pending node whose tokens are not there yet stays as it is
            waiting = source_readers.get(key)
            if waiting:
                count = len(now[key][0])
                for node, needed in waiting.items():
                    if needed <= count and not node.stale:
                        node.stale = True
                        newly_stale.append(node)
        self._proposal, self._stopped = now, stopped

    def _forget_source(self, key: RequestKey) -> None:
        """`key` no longer runs (or its tokens are not the ones its nodes read): the nodes that
        name it as their source are dropped, so that no later tree finds them (the nodes that
        need `key` are stale: no tree reaches these through them again)."""
        for node in self._sourced.pop(key, ()):
            level = self._nodes.get(node.event.index)
            if level is not None and level.get(node.facts) is node:
                del level[node.facts]

    def _finish_source(self, key: RequestKey, tokens: tuple[int, ...]) -> None:
        """`key`'s proposal ended with `tokens`: the states that named it as their source are now
        exact, and their nodes move to the exact facts (whose nodes a tree from nothing would
        make) instead of being dropped and built again. A node whose expansion read nothing the
        move changes (a keyed step whose cut falls before the proposal's tokens, neither an
        extension nor a block's end; in no root state, which a move never makes) stays expanded;
        the others are re-expanded. A node is dropped instead where its state's length was guessed
        wrong, where the exact facts have a node already (the DAG merges into it: the node above
        it on its reject chain is re-expanded to find it) or are the root's; and so are the nodes
        below a pending step's accept edge (that step gets a key, and a new accept child)."""
        root_facts = self._root_facts
        exact_of: dict[_Facts, _Facts | None] = {}
        moved: dict[tuple[int, _Facts], _CachedNode] = {}  # (event index, old facts) -> node moving
        dropped: list[tuple[int, _Facts]] = []
        for node in self._sourced.pop(key, ()):
            facts = node.facts
            index = node.event.index
            level = self._nodes.get(index)
            if level is None or level.get(facts) is not node:
                continue  # dropped already
            exact = exact_of.get(facts, facts)
            if exact is facts:
                exact = None
                if facts.source_end is None:
                    known = TokenRun(facts.known + tokens)
                    exact = _Facts(known, len(known), True)
                    if exact.length != facts.length or exact == root_facts:
                        exact = None
                exact_of[facts] = exact
            del level[facts]
            if exact is None or exact in level:
                dropped.append((index, facts))
            else:
                moved[index, facts] = node
                level[exact] = node
                node.facts, node.root_of = exact, None
        newly_stale = self._newly_stale
        for node in moved.values():
            expansion, event = node.expansion, node.event
            if not node.stale and (
                expansion is None or expansion.key is None or expansion.is_fork or event.is_extension or event.ends_block
            ):
                node.stale = True
                newly_stale.append(node)
        for index, facts in dropped:  # the moved node whose reject child it was
            above = moved.get((index - 1, facts))
            if above is not None and not above.stale:
                above.stale = True
                newly_stale.append(above)

    def _node(self, event_index: int, facts: _Facts, schedule: Schedule) -> _CachedNode:
        level = self._nodes.get(event_index)
        if level is None:
            level = self._nodes[event_index] = {}
        node = level.get(facts)
        if node is None:
            event = self._events.get(event_index)
            if event is None:
                event = self._events[event_index] = schedule.event(event_index)
            node = level[facts] = _CachedNode(event, facts)
            self._stored += 1
            if facts.source is not None:
                sourced = self._sourced.get(facts.source)
                if sourced is None:
                    sourced = self._sourced[facts.source] = []
                sourced.append(node)
        return node

    def _expand(self, node: _CachedNode, rules: PlanRules, last_event: int, at_root: bool) -> None:
        event = node.event
        expansion = rules.expand(event, node.facts, event.index >= last_event, at_root, self._proposal, self._stopped)
        node.expansion, node.stale, node.read_root, node.look = expansion, False, at_root, _UNDRESSED
        if node.registered_with is not None:
            # no longer waiting as it did: a fork that got its tokens must not be re-expanded at
            # every later token of its source (its request's prefix is fixed now)
            waiting = self._source_readers.get(node.registered_with)
            if waiting is not None:
                waiting.pop(node, None)
            node.registered_with = None
        if expansion is None:
            node.branch_nodes = []
            source = node.facts.source
            if source is not None:  # dead until its source runs, maybe: it reads the source's knowledge
                self._source_readers.setdefault(source, {})[node] = _NEVER_GROWN
                node.registered_with = source
            return
        if expansion.key is not None:
            self._readers.setdefault(expansion.key, set()).add(node)
        elif expansion.pending:
            source, needed = expansion.fork  # type: ignore[misc]
            self._source_readers.setdefault(source, {})[node] = needed
            node.registered_with = source
        below = self._nodes.get(event.index + 1)
        branch_nodes: list[tuple[_CachedNode, float]] = []
        for child, p in expansion.branches:
            found = below.get(child) if below is not None else None
            branch_nodes.append((found if found is not None else self._node(event.index + 1, child, rules.schedule), p))
            below = self._nodes[event.index + 1]
        node.branch_nodes = branch_nodes

    def tree(
        self,
        tokens: tuple[int, ...],
        event_index: int,
        rules: PlanRules,
        *,
        version: int,
        depends_on: object = None,
        max_keyed_depth: int,
        proposal: ProposalKnowledge | None = None,
        stopped_early: StoppedEarly | None = None,
        changed: Iterable[RequestKey] | None = None,
        min_reach: float = 0.0,
    ) -> PlanTree:
        """The DAG of future events from the realized state `tokens` at event `event_index`
        (see `build_plan_tree`). `version` must change whenever `rules`' branch law does, and
        `depends_on` be another object whenever its cut law does. `changed`: the requests whose
        `proposal` entry may differ from the last tree's (None: any may)."""
        min_mass = int(min_reach * MASS_SCALE)
        schedule = rules.schedule
        max_depth = min(MAX_PLAN_DEPTH, schedule.num_events - event_index)
        last_event = event_index + max_depth - 1
        afresh = self._sync(event_index, (version, depends_on, last_event))
        self._learn(proposal, stopped_early, None if afresh else changed)
        if tokens is not self._root_tokens[0]:
            self._root_tokens = (tokens, TokenRun(tuple(tokens)))
        root = self._node(event_index, _Facts(self._root_tokens[1], len(tokens), True), schedule)
        shape = (root, rules, max_keyed_depth, max_depth, min_mass)
        walked, self._walked = self._walked, shape
        stale, self._newly_stale = self._newly_stale, []
        self._rules, self._last_event, self._min_mass = rules, last_event, min_mass
        if afresh or walked != shape:
            self._walk_all(root, rules, last_event, max_keyed_depth, max_depth)
        else:
            self._update(stale, max_keyed_depth, max_depth)
        nodes = sum(map(len, self._members))
        self._last_tree_nodes = nodes
        fork_points = self._fork_points
        if fork_points is None:  # sorted keys compare their prefixes: only when a count changed
            fork_needs = self._fork_needs
            fork_points = self._fork_points = {source: min(fork_needs[source]) for source in sorted(fork_needs)}
        return PlanTree(
            root,
            self._key_nodes.keys(),
            fork_points,
            self._fork_nodes.keys(),
            self._root_state_nodes.keys(),
            1.0 if nodes > self._free_nodes else 0.0,
        )


def build_plan_tree(
    tokens: tuple[int, ...],
    event_index: int,
    schedule: Schedule,
    *,
    fixed_length: bool,
    stop_at_eos: bool,
    eos_token_id: int | None,
    cut_for: Callable[[int, int], int | None],
    accept_branch_probability: Callable[[int, float], float],
    max_keyed_depth: int,
    requests_per_step: int = 1,
    proposal: ProposalKnowledge | None = None,
    stopped_early: StoppedEarly | None = None,
    min_reach: float = 0.0,
) -> PlanTree:
    """The DAG of future events from the realized state `tokens` at event `event_index`, built
    from nothing (a `PlanCache` gives the same trees, reusing their nodes). A node the walk
    reaches with probability below `min_reach` is not expanded (dead).

    `proposal[key]` tells what is known of a request's proposal (streaming); without it nothing
    below an accept edge is.
    """
    rules = PlanRules(schedule, fixed_length, stop_at_eos, eos_token_id, cut_for, accept_branch_probability, requests_per_step)
    return PlanCache().tree(
        tokens, event_index, rules, version=0, max_keyed_depth=max_keyed_depth, proposal=proposal, stopped_early=stopped_early,
        min_reach=min_reach,
    )
