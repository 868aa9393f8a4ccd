"""Exact law of the power-sampling procedure by enumeration, written apart from the library.

Only the model's next-token log-probabilities come from the engine; the proposal law, the MH
kernel (with its length correction), the extensions and the stopping rule are re-derived here
from ALGORITHM.md, so a wrong kernel in the library cannot agree with this reference.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np


class Enumerator:
    def __init__(self, engine, prompt, *, alpha, tau, block_size, num_blocks, mh_steps, fixed_length, stop_at_eos=True):
        self.engine = engine
        self.prompt = tuple(prompt)
        self.alpha, self.tau = alpha, tau
        self.block_size, self.num_blocks, self.mh_steps = block_size, num_blocks, mh_steps
        self.eos = None if fixed_length else engine.eos_token_id
        self.stop_at_eos = stop_at_eos
        self._cache: dict = {}

    def _logp0(self, generated):
        key = generated
        if key not in self._cache:
            self._cache[key] = np.asarray(self.engine.next_token_logprobs(list(self.prompt + generated)), float)
        return self._cache[key]

    def _logq(self, generated):
        z = self._logp0(generated) / self.tau
        return z - np.logaddexp.reduce(z)

    def seq_logp0(self, tokens, start):
        return sum(self._logp0(tokens[:i])[tokens[i]] for i in range(start, len(tokens)))

    def seq_logq(self, tokens, start):
        return sum(self._logq(tokens[:i])[tokens[i]] for i in range(start, len(tokens)))

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

    def mh_step(self, dist, horizon, *, length_correction=True):
        new = defaultdict(float)
        for x, px in dist.items():
            n = len(x)
            for c in range(n):
                x_p0, x_q = self.seq_logp0(x, c), self.seq_logq(x, c)
                for s, qs in self.completions(x[:c], horizon):
                    y = x[:c] + s
                    log_r = self.alpha * (self.seq_logp0(y, c) - x_p0) + x_q - self.seq_logq(y, c)
                    if length_correction:
                        log_r += math.log(n) - math.log(len(y))
                    a = math.exp(min(0.0, log_r))
                    new[y] += px * qs * a / n
                    new[x] += px * qs * (1.0 - a) / n
        return new

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
