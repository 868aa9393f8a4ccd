"""The toy model (any engine with deterministic completions) on a continuous-batching device
simulated in virtual time.

Requests are submitted one at a time and run as sequences of a continuously batched decode loop:
each decode step generates one token for every running sequence and costs

    step_cost * max(1, running / saturation) + step_cost_per_sequence * running

time units (`step_time`). The first term is a GPU's roofline: a decode step reads all the weights
whatever the batch (memory-bound, flat) until the batch's compute outgrows that read at
`saturation` sequences, after which the step is compute-bound and its cost grows in proportion
to the tokens it decodes (so the device has a peak of `saturation / step_cost` tokens per time
unit). `saturation` = inf (the default) is a device whose batch is free at any size; b > 0 with
it is a CPU, whose step grows from the first sequence. A request starts as soon as it is
submitted (its prompt is in the prefix cache, so prefill is free) unless `max_running` sequences already run; waiting requests start in
priority order (lower first, then first come). Completions are the toy's exact completions, a
pure function of the request, revealed one token per decode step, so partial tokens are final
and figures are exact and noise-free.

The same engine serves rounds (`generate`: submit a batch, run until all of it ends) and
streaming (`submit`, `abort`, `advance`), so schedules compare on one clock.

A measured device (`device`: a DeviceCurve, presto_ray/engines/device_curve.py) replaces the
analytic step: time is then in seconds, a decode step costs what was measured at its batch size,
the prompt tokens a request does not read from the prefix cache cost `prefill_time_per_token_s`
in the next step, and every event handed to a chain (or, in a batch call, every completion)
costs the host `host_time_per_event_s`.

A request runs (or waits) from its submission, but its completion is computed at the next
`advance`, with every other request submitted since, in one call of the model, as a device
decodes a batch: the toy decodes them in lockstep, and a real engine replayed on a measured device
makes one call per step. What a chain asked of a request before then (its wake points, new bounds)
is applied when it is computed, in the order asked, so every figure is that of computing each
request at its submission.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field, replace
from typing import Sequence, cast

from presto_ray.early_rejection import RejectionBound, stop_length
from presto_ray.engines.device_curve import DeviceCurve
from presto_ray.engines.base import CallAccounting, Completion, Engine, EngineEvent, EngineOutput, ProposalRequest, Tokenizer
from presto_ray.speculation import free_batch


@dataclass
class _Sequence:
    handle: int
    request: ProposalRequest
    priority: float
    # what the request reveals: `full`, or its first tokens when its bounds stop it (None: not
    # computed yet, at most until the next `advance`; it has generated nothing)
    completion: Completion | None = None
    full: Completion | None = None
    generated: int = 0
    wakes: set[int] = field(default_factory=set)  # token counts someone waits for (forks)
    until: int = 0  # its next event: the token count where it ends or the first of `wakes` (once computed)
    # before it is computed: the wake points and bounds asked of it, in order
    deferred: list[int | Sequence[RejectionBound]] = field(default_factory=list)
    aborted: bool = False

    @property
    def remaining(self) -> int:
        return len(self.completion.token_ids) - self.generated  # type: ignore[union-attr]

    def plan_next_event(self) -> None:
        """Set `until` after its completion or wakes changed."""
        self.until = min(len(self.completion.token_ids), *self.wakes) if self.wakes else len(self.completion.token_ids)  # type: ignore[union-attr]


@dataclass
class ClockStats:
    decode_steps: int = 0  # decode iterations with at least one running sequence
    time: float = 0.0  # virtual time: sum over decode steps of step_time(running)
    generated_tokens: int = 0  # tokens decoded, aborted requests' included
    aborted_requests: int = 0
    wasted_tokens: int = 0  # tokens decoded by requests aborted before they ended
    early_stopped_requests: int = 0  # ended by early rejection (their slot freed at once)
    max_running: int = 0
    max_live: int = 0  # most requests running or waiting at once


class VirtualClockEngine:
    """A ToyEngine behind a continuous-batching scheduler on a virtual clock (see module doc).

    `model` computes each completion (it must be a pure function of the request, as the toy's
    is); the clock only decides when its tokens are revealed. A request the model refuses ends at
    the next step with an event that carries the model's error.
    """

    def __init__(
        self,
        model: Engine,
        *,
        step_cost: float = 1.0,
        step_cost_per_sequence: float = 0.0,
        max_running: int | None = None,
        saturation: float = float("inf"),
        seconds_per_time_unit: float = 0.0,
        device: DeviceCurve | None = None,
        speculation_batch: float | None = None,
    ) -> None:
        if not saturation > 0:
            raise ValueError(f"saturation must be positive (inf: a batch free at any size), got {saturation}")
        self.model = model
        self.tokenizer: Tokenizer = model.tokenizer
        self.eos_token_id: int | None = model.eos_token_id
        self.model_name: str = model.model_name
        self.context_length: int = model.context_length
        self.step_cost, self.step_cost_per_sequence = float(step_cost), float(step_cost_per_sequence)
        self.max_running = max_running
        self.saturation = float(saturation)
        # In an engine replica (`next_events`), virtual time also passes in wall time at this rate,
        # so that requests are in flight long enough to be raced, aborted or lost with the replica.
        self.seconds_per_time_unit = float(seconds_per_time_unit)
        self.device = device
        self.speculation_batch = speculation_batch  # a cap on free_batch (the model's own setting)
        self._prefill_tokens = 0  # measured device: prompt tokens not cached, charged to the next step
        self.clock = ClockStats()
        self._handles = itertools.count()
        self._order = itertools.count()
        self._running: dict[int, _Sequence] = {}
        self._waiting: list[tuple[float, int, _Sequence]] = []  # heap by (priority, arrival)
        self._finished: list[EngineEvent] = []  # ended at submission (no tokens to generate)
        self._calls = 0
        self._submitted = CallAccounting()  # requests and prompt tokens (streaming makes no calls)
        self._uncomputed: list[_Sequence] = []  # submitted since the last model call, in order (aborted ones too)

    # --- streaming -------------------------------------------------------------------------
    def submit(self, request: ProposalRequest, priority: float = 0.0) -> int:
        seq = _Sequence(next(self._handles), request, priority)
        self._uncomputed.append(seq)
        if request.max_new_tokens == 0:
            # it ends at once, with nothing to run: computed now (or refused), it is never live
            self._compute()
            if seq.completion is not None:
                self._finished.append(EngineEvent(seq.handle, 0, seq.completion))
        elif self.max_running is None or len(self._running) < self.max_running:
            self._running[seq.handle] = seq
        else:
            heapq.heappush(self._waiting, (priority, next(self._order), seq))
        self.clock.max_live = max(self.clock.max_live, len(self._running) + len(self._waiting))
        return seq.handle

    def _compute(self) -> None:
        """Compute the completions of the requests submitted since the last call, in one model
        call, and apply to each what was asked of it meanwhile, in order."""
        pending, self._uncomputed = self._uncomputed, []
        if not pending:
            return
        for seq, full in self._call_model(pending):
            if not full.token_ids and seq.request.max_new_tokens:
                # it ran from its submission: only an empty completion could have ended it there
                raise RuntimeError(f"{type(self.model).__name__} returned no token for a request of max_new_tokens > 0")
            seq.full = full
            seq.completion = _stopped(full, seq.request.rejection_bounds, 0)
            seq.plan_next_event()
            deferred, seq.deferred = seq.deferred, []
            for asked in deferred:  # taken now as they would have been then: nothing generated since
                if isinstance(asked, int):
                    self.wake_at(seq.handle, asked)
                else:
                    self.set_rejection_bounds(seq.handle, asked)

    def _call_model(self, pending: list[_Sequence]) -> list[tuple[_Sequence, Completion]]:
        """`pending`'s whole proposals (so that bounds set later can stop them anywhere) in one
        model call, its cost counted; a request the model refuses fails the call, so then each
        goes alone and the refused ones end with their error."""
        requests = [replace(seq.request, rejection_bounds=()) for seq in pending]
        try:
            outputs = [self.model.generate(requests)]
            computed = list(zip(pending, outputs[0].completions))
        except Exception:
            outputs, computed = [], []
            for seq, request in zip(pending, requests):
                try:
                    outputs.append(self.model.generate([request]))
                except Exception as error:
                    self._refuse(seq, error)
                    continue
                computed.append((seq, outputs[-1].completions[0]))
        for output in outputs:
            self._submitted.num_requests += output.accounting.num_requests
            self._submitted.prompt_tokens += output.accounting.prompt_tokens
            self._submitted.cached_prompt_tokens += output.accounting.cached_prompt_tokens
            self._prefill_tokens += output.accounting.prompt_tokens - output.accounting.cached_prompt_tokens
        return computed

    def _refuse(self, seq: _Sequence, error: Exception) -> None:
        """`seq`'s model refused it: it ends with that error, having generated nothing (an
        aborted one just goes)."""
        if seq.aborted:
            return
        if self._running.pop(seq.handle, None) is None:
            self._waiting = [entry for entry in self._waiting if entry[2].handle != seq.handle]
            heapq.heapify(self._waiting)
        self._finished.append(EngineEvent(seq.handle, 0, error=error))
        self._admit()

    def wake_at(self, handle: int, generated: int) -> None:
        """Report an event when `handle` has generated `generated` tokens (a fork point)."""
        seq = self._find(handle)
        if seq is None:
            return
        if seq.completion is None:
            if generated > 0:
                seq.deferred.append(generated)
            return
        if seq.generated >= generated > 0:  # it has them (asked by a chain that had not heard): at once
            self._finished.append(EngineEvent(handle, seq.generated))
        elif seq.generated < generated < len(seq.completion.token_ids):
            seq.wakes.add(generated)
            seq.plan_next_event()

    def partial_tokens(self, handle: int) -> tuple[int, ...]:
        """The tokens `handle` has generated so far (final: a proposal never rewrites them)."""
        seq = self._find(handle)
        return seq.completion.token_ids[: seq.generated] if seq is not None and seq.completion is not None else ()

    def abort(self, handle: int) -> None:
        # a request not computed yet still is at the next model call: the model's prefix cache
        # sees every request, as it did when each was computed at its submission
        seq = self._running.pop(handle, None)
        if seq is None:
            waiting = [entry for entry in self._waiting if entry[2].handle == handle]
            if not waiting:
                return
            self._waiting.remove(waiting[0])
            heapq.heapify(self._waiting)
            seq = waiting[0][2]
        seq.aborted = True
        self.clock.aborted_requests += 1
        self.clock.wasted_tokens += seq.generated
        self._admit()

    def set_rejection_bounds(self, handle: int, bounds: Sequence[RejectionBound]) -> None:
        """Replace the bounds of a live request: it now stops once these reject its tokens, at once
        if they reject what it has generated already (unknown or ended handles are ignored)."""
        seq = self._find(handle)
        if seq is None:
            return
        if seq.full is None:
            seq.deferred.append(tuple(bounds))
            return
        seq.completion = _stopped(seq.full, bounds, seq.generated)
        seq.plan_next_event()
        if seq.remaining == 0:  # stopped by what it has generated: it ends now
            if self._running.pop(handle, None) is None:
                self._waiting = [entry for entry in self._waiting if entry[2].handle != handle]
                heapq.heapify(self._waiting)
            self.clock.early_stopped_requests += 1
            self._finished.append(EngineEvent(handle, seq.generated, seq.completion))
            self._admit()

    def step_time(self, running: int) -> float:
        """Virtual time of one decode step with `running` sequences (see the module doc)."""
        if self.device is not None:
            return self.device.step_time(running)
        return self.step_cost * max(1.0, running / self.saturation) + self.step_cost_per_sequence * running

    @property
    def free_batch(self) -> float:
        """Sequences the chains may share: where the batch stops being free. A CPU-like step
        (b > 0) holds `speculation.free_batch` (three lone steps); a saturating one at most
        `saturation`, past which every speculative token takes device time from the other chains'
        needed ones; both capped by `max_running` (docs/benchmarks.md, the saturating device). A
        measured device holds what its curve does before a step costs three lone ones. At most
        `speculation_batch` where set."""
        cap = float("inf") if self.speculation_batch is None else float(self.speculation_batch)
        if self.device is not None:
            room = self.device.free_batch()
            return min(room, self.max_running, cap) if self.max_running is not None else min(room, cap)
        return min(free_batch(self.step_cost, self.step_cost_per_sequence, self.max_running), self.saturation, cap)

    def live_handles(self) -> set[int]:
        """Requests running or waiting (aborted and finished ones are gone)."""
        return set(self._running) | {entry[2].handle for entry in self._waiting}

    @property
    def busy(self) -> bool:
        return bool(self._running or self._waiting or self._finished)

    def advance(self) -> list[EngineEvent]:
        """Run decode steps up to the next completion or wake point; the events that happened."""
        self._compute()
        if self._finished:
            events, self._finished = self._finished, []
            return self._handed(events)
        if not self._running:
            return []
        steps = min([s.until - s.generated for s in self._running.values()])
        running = len(self._running)
        self.clock.decode_steps += steps
        self.clock.time += steps * self.step_time(running)
        if self.device is not None:
            self.clock.time += self._prefill_tokens * self.device.prefill_time_per_token_s
            self._prefill_tokens = 0
        self.clock.generated_tokens += steps * running
        self.clock.max_running = max(self.clock.max_running, running)
        events = []
        for seq in list(self._running.values()):
            seq.generated += steps
            if seq.generated < seq.until:
                continue
            if seq.remaining == 0:
                del self._running[seq.handle]
                completion = cast(Completion, seq.completion)  # computed: a step computes first
                self.clock.early_stopped_requests += completion.stopped_early
                events.append(EngineEvent(seq.handle, seq.generated, completion))
            elif seq.generated in seq.wakes:
                seq.wakes = {w for w in seq.wakes if w > seq.generated}
                seq.plan_next_event()
                events.append(EngineEvent(seq.handle, seq.generated))
        self._admit()
        return self._handed(events)

    def _handed(self, events: list[EngineEvent]) -> list[EngineEvent]:
        """A measured device: the host's time to hand `events` to their chains."""
        if self.device is not None:
            self.clock.time += len(events) * self.device.host_time_per_event_s
        return events

    async def next_events(self, timeout_s: float) -> list[EngineEvent]:
        """`advance` for an event loop (an engine replica actor), taking the virtual time it
        advanced in wall time at `seconds_per_time_unit` (0: at once)."""
        before = self.clock.time
        events = self.advance()
        if self.seconds_per_time_unit:
            await asyncio.sleep((self.clock.time - before) * self.seconds_per_time_unit)
        return events

    def streaming(self) -> "VirtualClockEngine":
        return self

    def accounting(self) -> CallAccounting:
        """Requests submitted and tokens decoded so far (`calls` counts `generate` calls only)."""
        self._compute()
        return CallAccounting(
            calls=self._calls,
            num_requests=self._submitted.num_requests,
            prompt_tokens=self._submitted.prompt_tokens,
            cached_prompt_tokens=self._submitted.cached_prompt_tokens,
            generated_tokens=self.clock.generated_tokens,
        )

    # --- the batch protocol (rounds and the serial chain) -----------------------------------
    def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        self._calls += 1
        handles = [self.submit(r) for r in requests]
        done: dict[int, Completion] = {}
        while len(done) < len(handles):
            for event in self.advance():
                if event.error is not None:  # the model refused one: the call fails with its error, leaving nothing running
                    for handle in handles:
                        self.abort(handle)
                    raise event.error
                if event.completion is not None:
                    done[event.handle] = event.completion
        completions = [done[h] for h in handles]
        accounting = CallAccounting(
            calls=1,
            num_requests=len(requests),
            prompt_tokens=sum(len(r.context_token_ids) for r in requests),
            generated_tokens=sum(len(c.token_ids) for c in completions),
        )
        return EngineOutput(completions, accounting)

    async def agenerate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        return await asyncio.to_thread(self.generate, requests)

    def shutdown(self) -> None:
        """Nothing to free."""

    # --- internals --------------------------------------------------------------------------
    def _find(self, handle: int) -> _Sequence | None:
        if handle in self._running:
            return self._running[handle]
        return next((entry[2] for entry in self._waiting if entry[2].handle == handle), None)

    def _admit(self) -> None:
        while self._waiting and (self.max_running is None or len(self._running) < self.max_running):
            _, _, seq = heapq.heappop(self._waiting)
            self._running[seq.handle] = seq


def _stopped(full: Completion, bounds: Sequence[RejectionBound], generated: int) -> Completion:
    """What a request with `bounds` reveals: `full`, or its first tokens up to where every bound
    rejects, but never fewer than the `generated` tokens already revealed (a rejection certain
    after m tokens stays certain after more)."""
    length = stop_length(bounds, full.logp0, full.logq, full.entropy)
    if length is None or max(length, generated) >= len(full.token_ids):
        return full
    return full.truncated(max(length, generated))
