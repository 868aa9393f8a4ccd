"""Exact law of the power-sampling procedure by enumeration, written apart from the library.

Only the model's next-token log-probabilities come from the engine; the proposal law, the MH
kernel (with its length correction), the extensions and the stopping rule are re-derived here
from the math in docs/algorithm.md, so a wrong kernel in the library cannot agree with this reference.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np


class Enumerator:
    def __init__(self, engine, prompt, *, alpha, tau, block_size, num_blocks, mh_steps, fixed_length, stop_at_eos=True,
                 sampler="power_mh", num_tries=2, entropy_beta=4.0):
        self.engine = engine
        self.prompt = tuple(prompt)
        self.alpha, self.tau = alpha, tau
        self.block_size, self.num_blocks, self.mh_steps = block_size, num_blocks, mh_steps
        self.eos = None if fixed_length else engine.eos_token_id
        self.stop_at_eos = stop_at_eos
        self.sampler, self.num_tries, self.beta = sampler, num_tries, entropy_beta
        self._cache: dict = {}

    def _logp0(self, generated):
        key = generated
        if key not in self._cache:
            self._cache[key] = np.asarray(self.engine.next_token_logprobs(list(self.prompt + generated)), float)
        return self._cache[key]

    def _logq(self, generated):
        key = ("q", generated)
        if key not in self._cache:
            z = self._logp0(generated) / self.tau
            self._cache[key] = z - np.logaddexp.reduce(z)
        return self._cache[key]

    def seq_logp0(self, tokens, start):
        return sum(self._logp0(tokens[:i])[tokens[i]] for i in range(start, len(tokens)))

    def seq_logq(self, tokens, start):
        return sum(self._logq(tokens[:i])[tokens[i]] for i in range(start, len(tokens)))

    def cut_probabilities(self, x):
        """P(c | x): uniform, or EntropyCut's lambda with H_{-1} = 0 and a uniform fallback."""
        n = len(x)
        if self.sampler != "entropy_cut":
            return [1.0 / n] * n
        entropies = []
        for m in range(n):
            lp = self._logp0(x[:m])
            entropies.append(-sum(math.exp(v) * v for v in lp))
        jumps = [max(0.0, entropies[m] - (entropies[m - 1] if m else 0.0)) ** self.beta for m in range(n)]
        total = sum(jumps)
        return [j / total for j in jumps] if total > 0 else [1.0 / n] * n

    def completions(self, prefix, horizon):
        """All (suffix, q probability) generated from `prefix` until EOS or the horizon."""
        out = []

        def grow(tokens, logq):
            if len(tokens) == horizon or (self.eos is not None and tokens and tokens[-1] == self.eos):
                out.append((tokens[len(prefix):], math.exp(logq)))
                return
            lq = self._logq(tokens)
            for t in range(len(lq)):
                grow(tokens + (t,), logq + lq[t])

        grow(tuple(prefix), 0.0)
        return out

    def extend(self, dist, horizon):
        new = defaultdict(float)
        for x, px in dist.items():
            if len(x) >= horizon or (self.eos is not None and x and x[-1] == self.eos):
                new[x] += px
                continue
            for s, qs in self.completions(x, horizon):
                new[x + s] += px * qs
        return new

    def log_weight(self, tokens, cut):
        """log pi/q on the suffix after `cut`: alpha log p0 - log q_tau."""
        return self.alpha * self.seq_logp0(tokens, cut) - self.seq_logq(tokens, cut)

    def mh_step(self, dist, horizon, *, length_correction=True):
        new = defaultdict(float)
        for x, px in dist.items():
            cut_px = self.cut_probabilities(x)
            for c in range(len(x)):
                if cut_px[c] == 0.0:
                    continue
                step = self._multi_try if self.sampler == "multi_try" else self._single_try
                for y, p in step(x, c, horizon, length_correction).items():
                    new[y] += px * cut_px[c] * p
        return new

    def _cut_term(self, x, y, c, length_correction):
        """P(c | y) / P(c | x): the cut law's share of the ratio."""
        if not length_correction:
            return 1.0
        return self.cut_probabilities(y)[c] / self.cut_probabilities(x)[c]

    def _single_try(self, x, c, horizon, length_correction):
        out = defaultdict(float)
        w_x = self.log_weight(x, c)
        for s, qs in self.completions(x[:c], horizon):
            y = x[:c] + s
            a = min(1.0, math.exp(self.log_weight(y, c) - w_x) * self._cut_term(x, y, c, length_correction))
            out[y] += qs * a
            out[x] += qs * (1.0 - a)
        return out

    def _multi_try(self, x, c, horizon, length_correction, naive=False):
        """M independent tries; select y_j w.p. w_j/W; accept w.p. min(1, W / (W - w_j + w_x))."""
        out = defaultdict(float)
        options = self.completions(x[:c], horizon)
        w_x = math.exp(self.log_weight(x, c))
        # each option's sequence, weight and cut term once: the tuples of tries only recombine them
        ys = [x[:c] + s for s, _ in options]
        weights = [math.exp(self.log_weight(y, c)) for y in ys]
        cut_terms = [self._cut_term(x, y, c, length_correction) for y in ys]
        for combo in itertools.product(range(len(options)), repeat=self.num_tries):
            p_tries = math.prod(options[i][1] for i in combo)
            w = [weights[i] for i in combo]
            total = sum(w)
            for j, i in enumerate(combo):
                pick = w[j] / total
                ratio = (w[j] / w_x) if self.naive_mtm else total / (total - w[j] + w_x)
                a = min(1.0, ratio * cut_terms[i])
                out[ys[i]] += p_tries * pick * a
                out[x] += p_tries * pick * (1.0 - a)
        return out

    naive_mtm = False  # a deliberately wrong ratio, to show the test's power

    def final_distribution(self, *, length_correction=True):
        """Law of the output (cut after the first EOS) at the end of the procedure."""
        eos = self.engine.eos_token_id
        running = {(): 1.0}
        finished = defaultdict(float)
        for block in range(self.num_blocks):
            horizon = (block + 1) * self.block_size
            running = self.extend(running, horizon)
            for _ in range(self.mh_steps):
                running = self.mh_step(running, horizon, length_correction=length_correction)
            if self.stop_at_eos and self.eos is not None:
                for x in [x for x in running if x and x[-1] == self.eos]:
                    finished[x] += running.pop(x)
        for x, p in running.items():
            finished[x] += p
        out = defaultdict(float)
        for x, p in finished.items():
            if eos is not None and eos in x:
                x = x[: x.index(eos) + 1]
            out[x] += p
        return dict(out)


def chi_square_pvalue(exact: dict, counts: dict, n: int, min_expected: float = 5.0) -> float:
    """Pearson chi-square of observed counts against the exact law (small cells pooled)."""
    from scipy.stats import chisquare

    assert abs(sum(exact.values()) - 1.0) < 1e-9, sum(exact.values())
    unknown = set(counts) - set(exact)
    assert not unknown, f"samples outside the support: {sorted(unknown)[:5]}"
    big = sorted(x for x, p in exact.items() if p * n >= min_expected)
    small = [x for x in exact if x not in set(big)]
    observed = [counts.get(x, 0) for x in big]
    expected = [exact[x] * n for x in big]
    if small:
        observed.append(sum(counts.get(x, 0) for x in small))
        expected.append(sum(exact[x] for x in small) * n)
    return float(chisquare(observed, expected).pvalue)
