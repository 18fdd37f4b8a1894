"""Adaptive steps: which kind of TokenSwift step runs next, chosen by each kind's measured tokens/s.

A step is FULL (draft pass + the heads' tree), HALF (the same draft pass, the tree's likeliest half of the node
budget), NARROW (the same draft pass, a narrow trie), LOOKUP (n-gram continuations of the root only, no draft pass)
or PLAIN (the root alone: an AR step). Every kind emits AR's tokens; the choice changes only how fast they come."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FULL, HALF, NARROW, LOOKUP, PLAIN = "full", "half", "narrow", "lookup", "plain"
KINDS = (FULL, LOOKUP, PLAIN)  # adaptive steps: draft + tree, n-gram lookup only, the root alone (an AR step)
# ... and, where --tree or --ngram-topk is wider than this, a full step on a narrow trie: the draft's
# first candidate at each depth plus one n-gram continuation (the trie the CPU measured best, docs/benchmarks.md)
WIDE_KINDS = (FULL, NARROW, LOOKUP, PLAIN)
# ... and, where the tree is cut to a node budget of at least 2 * HALF_MIN_NODES (--max-nodes; the GPU's 32), a full
# step on the likeliest half of it. On the H200 at 100K context a 16-node verify pass cost 1.16x an AR step, a
# 32-node one 1.45x, an 8-node one 1.13x (session 51); on the embedded model the 16 likeliest nodes took as few
# steps as 32 and 64 for the same tokens (session 55). Smaller halves cost what a narrow trie does.
HALF_MIN_NODES = 16
HALF_KINDS = (FULL, HALF, NARROW, LOOKUP, PLAIN)
PROBE_EVERY = 16  # adaptive steps: how often a slower kind of step is tried again at first ...
MAX_PROBE_EVERY = 1024  # ... doubling (per kind) while its probes do not win it the lead
# ... and never more often than keeps what the probes of all other kinds together cost beyond the leader's
# work within this share of the leader's time (each kind 1 / (kinds - 1) of it). On an H100 (embedded model,
# paper sampling, 4,096 tokens) three drafting kinds each probed every 256 steps (the cap before
# MAX_PROBE_EVERY rose to 1024) cost 2-3% of the run.
PROBE_BUDGET = 0.01
LEAD_MARGIN = 1.05  # a drafting kind takes the lead when its tokens/s beat the leader's by this factor
RATE_EMA = 0.1  # weight of the newest step in a kind's tokens and seconds per step
# A kind's seconds from its last step more than this many steps back are stale: the machine's load may have changed
# since (another process on a core makes every step slower, plain steps' EMA follows within ~10 steps, a probe's
# seconds stay as they were). A stale kind is timed again before it may take the lead, and that step's seconds replace
# its EMA. Under a load switched on and off every 15 s, lookup steps timed once at a run's start took the lead
# from plain steps as soon as the load came on (session 56).
STALE_STEPS = 64
# A kind not yet timed runs first, up to this many times: a kind's first steps may capture CUDA graphs (untimed), and
# one whose steps are never timed as its own (lookup steps that find no n-gram while another kind leads are timed as
# plain steps: with --ngram-topk 0 all of them) would otherwise run at every step, no other kind probed again.
UNTIMED_TRIES = 8
# A timed step's seconds enter its kind's EMA at most this many times the EMA (a step the OS or the collector paused:
# one 100x step left plain steps' EMA at 10.9x their cost, so a 1.3x slower kind led and, by the probe budget, plain
# steps were not probed again for ~740 steps). A real change of load still shows: the EMA may grow 1.2x a step.
OUTLIER = 3.0
# ... and a kind's first seconds (or those that replaced stale ones) stand alone until its next timed step, which
# replaces them where they were more than PAUSED times its own (the first step was paused), else is averaged with them;
# and its next probe keeps the doubling interval, not the probe budget's. A first full step paused 5x (a page fault,
# the collector) otherwise ranked the fastest kind below plain steps, the budget put its next probe 1,024 steps away,
# and the EMA took that probe's ~20 follow-ups to forget the pause (a review's simulation: the lead from step 1,026,
# now 18). One quick probe only, and not the lesser of the two timings: lookup steps, timed as their own only when they
# find an n-gram (a few in ten under the paper's sampling), kept one step's seconds for hundreds of steps and were
# probed on the doubling interval all that time, and the lesser of two noisy timings ranked a slower kind closer to the
# leader, probed more often: the paper cell drafted in 16 steps of 1,020 where 6 did before, 0.98x AR (session 65).
PAUSED = 2.0
TOKENS_PER_STEP_EMA = 0.25  # weight of the newest step in the tokens/step estimate (one-pass LM heads)


def step_kinds(wide: bool, budget: int) -> tuple[str, ...]:
    """The kinds of step a run chooses among: a `wide` trie (more than one candidate at a depth or n-gram path)
    adds NARROW; one pruned to `budget` nodes (0: not pruned) of at least 2 * HALF_MIN_NODES adds HALF."""
    if wide and budget >= 2 * HALF_MIN_NODES:
        return HALF_KINDS
    return WIDE_KINDS if wide else KINDS


@dataclass
class StepSchedule:
    """The measurements adaptive steps choose by, and the probe schedule. `adaptive=False`: every
    step is FULL. Deterministic given the recorded times; under tensor parallelism rank 0's choice
    is broadcast (the loop does it), since each rank times its own steps."""

    kinds: tuple[str, ...] = KINDS
    adaptive: bool = True
    # Each kind's tokens and seconds per step (EMAs; tokens None until it has run); their ratio is its tokens/s.
    step_tokens: dict[str, float | None] = field(default_factory=dict)
    step_seconds: dict[str, float] = field(default_factory=dict)
    since: dict[str, int] = field(default_factory=dict)  # steps since each kind last ran
    steps: int = 0  # steps chosen so far (a token block's plain steps counted)
    timed_at: dict[str, int] = field(default_factory=dict)  # `steps` at each kind's last timed step (or re-timing)
    refresh: set[str] = field(default_factory=set)  # kinds being timed again: their next seconds replace the old
    single: set[str] = field(default_factory=set)  # kinds whose seconds come from one step (see OUTLIER) ...
    quick: set[str] = field(default_factory=set)  # ... and whose next probe keeps the doubling interval
    tries: dict[str, int] = field(default_factory=dict)  # steps each kind ran while it had no rate
    probe_every: dict[str, int] = field(default_factory=dict)  # each kind's probe interval
    best: str | None = None  # the leading kind
    follow: str | None = None  # a probed kind whose step beat the leader: run it again next step
    tokens_per_step: float = 1.0  # EMA of the tokens any step emits (deterministic: same on every rank)

    def __post_init__(self) -> None:
        self.step_tokens = {k: self.step_tokens.get(k) for k in self.kinds}
        self.step_seconds = {k: self.step_seconds.get(k, 0.0) for k in self.kinds}
        self.since = {k: self.since.get(k, 0) for k in self.kinds}
        self.timed_at = {k: self.timed_at.get(k, 0) for k in self.kinds}
        self.tries = {k: self.tries.get(k, 0) for k in self.kinds}
        self.probe_every = {k: self.probe_every.get(k, PROBE_EVERY) for k in self.kinds}

    def rate(self, kind: str) -> float | None:
        """A kind's measured tokens/s: the ratio of its tokens and seconds per step (EMAs), steadier
        than an average of per-step rates when a step emits 1 or 2 tokens at random; None until it has
        been timed (its tokens may be known before: `would_emit`)."""
        tokens = self.step_tokens[kind]
        return None if tokens is None or self.step_seconds[kind] <= 0 else tokens / self.step_seconds[kind]

    def choose(self) -> str:
        """FULL, HALF or NARROW (where the configured trie is wide, its verify pass may cost more than its
        extra tokens are worth, as at long contexts on a GPU), LOOKUP or PLAIN (for text where no
        draft pays for itself): whichever has been fastest, probing each other kind every
        `interval(kind)` steps; probes cost time, so a kind's interval doubles (up to
        MAX_PROBE_EVERY) at each probe and starts over only when that kind wins the lead (two others
        swapping the lead do not make it probed more often), and a costly probe waits longer (see
        interval). A probe whose step beat the leader is followed up at once (text that has turned
        repetitive should not wait a long probe interval per sample), while its steps keep beating it."""
        if not self.adaptive:
            return FULL
        rates = {kind: self.rate(kind) for kind in self.kinds}
        for kind in self.kinds:
            if rates[kind] is None and self.tries[kind] < UNTIMED_TRIES:
                self.tries[kind] += 1
                return self._run(kind)
        rated = [kind for kind in self.kinds if rates[kind] is not None]  # (the others: probed on their intervals)
        if not rated:
            return self._run(self.kinds[-1])
        fastest = max(rated, key=lambda k: rates[k])  # type: ignore[arg-type,return-value]
        # A drafting kind takes the lead only for a clear margin: two kinds that do the same work (a
        # lookup step that found no n-gram is a plain step) would otherwise swap on noise, and a
        # drafting kind that leads on a lucky streak costs more than the plain step it displaced.
        # Plain steps, whose cost is AR's, take the lead back as soon as they are faster.
        margin = 1.0 if fastest == PLAIN else LEAD_MARGIN
        if self.best is None or rates[fastest] > margin * rates[self.best]:  # type: ignore[operator]
            if fastest != self.best:
                if self.best is not None and self.stale(fastest):  # timed under another load, maybe: timed
                    self.timed_at[fastest] = self.steps  # again first (once: its step may go untimed, as a lookup
                    self.refresh.add(fastest)  # step that finds no n-gram does), its seconds replacing the old ones
                    return self._run(fastest)
                self.probe_every[fastest] = PROBE_EVERY  # once it loses the lead again, probe it soon
            self.best = fastest
        best = self.best
        follow, self.follow = self.follow, None
        if follow is not None and follow != best:
            return self._run(follow)
        overdue = {k: self.since[k] - self.interval(k) for k in self.kinds if k != best}  # >= 0: due
        due = [k for k, late in overdue.items() if late >= 0]
        if due:
            kind = max(due, key=overdue.__getitem__)  # the most overdue
            self.probe_every[kind] = min(2 * self.probe_every[kind], MAX_PROBE_EVERY)
            return self._run(kind)
        return self._run(best)

    def hinted(self, kind: str) -> str:
        """Run `kind` now, instead of what choose() would pick, because the text itself suggests it (a
        lookup step where the text repeats an earlier passage): counted on the probe schedule as a
        step of that kind, and timed and recorded as one."""
        return self._run(kind)

    def interval(self, kind: str) -> int:
        """Steps between probes of `kind` while another leads: its doubling `probe_every`, but at
        least enough that what a probe costs beyond the leader's work (its seconds minus its tokens'
        time at the leader's rate) stays within its share of PROBE_BUDGET (split evenly among the kinds
        other than the leader) of the leader's time between probes (a full step on a wide trie can cost
        several plain steps for one token: probed every 16 steps, it would cost more than its rare wins
        gain); at most MAX_PROBE_EVERY. A kind's first probe after its first timing keeps its doubling interval (see
        OUTLIER)."""
        tokens, best = self.step_tokens[kind], self.best
        leader = self.rate(best) if best is not None else None
        if tokens is None or not leader or kind in self.quick:
            return self.probe_every[kind]
        extra = self.step_seconds[kind] - tokens / leader  # [s] per probe, beyond the leader's time for its tokens
        share = PROBE_BUDGET / max(len(self.kinds) - 1, 1)
        floor = extra / (share * max(self.step_seconds[best], 1e-9))  # type: ignore[index]
        return min(max(self.probe_every[kind], math.ceil(floor)), MAX_PROBE_EVERY)

    def plain_run(self, read_every: int, tokens_left: int) -> int:
        """How many plain steps may run now as one token block (runtime/blocks): 1 unless plain steps
        lead (a plain probe or follow-up is timed alone), at most `read_every` and `tokens_left`, and
        never past the step at which another kind's probe falls due, so that blocks keep the probe
        schedule of single steps. Call after choose() returned PLAIN."""
        if read_every <= 1 or self.best != PLAIN or self.follow is not None:
            return 1
        room = min(self.interval(k) - self.since[k] for k in self.kinds if k != PLAIN)
        return max(1, min(read_every, 1 + room, tokens_left))

    def skip(self, steps: int) -> None:
        """Count `steps` more plain steps (the rest of a token block) on the probe schedule."""
        for k in self.kinds:
            if k != PLAIN:
                self.since[k] += steps
        self.steps += steps

    def _run(self, kind: str) -> str:
        for k in self.kinds:
            self.since[k] += 1
        self.since[kind] = 0
        self.quick.discard(kind)  # (its quick probe, timed or not)
        self.steps += 1
        return kind

    def stale(self, kind: str) -> bool:
        """Whether `kind`'s seconds come from a step more than STALE_STEPS back (`since` counts from the kind
        chosen, this from the kind timed: a lookup step that found no n-gram may be timed as a plain one)."""
        return self.steps - self.timed_at[kind] > STALE_STEPS

    def record(self, kind: str, tokens: int, seconds: float | None) -> None:
        """A step's tokens, and its time unless None (a step that captured a CUDA graph or refilled
        the partial cache: one-off costs that would misjudge its kind for many steps). A lookup step that
        found no n-gram ran as a plain step: `record_empty_lookup`."""
        self.tokens_per_step = (1 - TOKENS_PER_STEP_EMA) * self.tokens_per_step + TOKENS_PER_STEP_EMA * tokens
        if seconds is None:
            return
        seconds = max(seconds, 1e-9)  # (a coarse or patched clock's 0 s made the kind's rate None, the leader's too)
        leader = self.rate(self.best) if self.best is not None else None
        beat = kind != self.best and leader is not None and tokens / seconds > leader
        self.follow = kind if beat else None
        self._timed(kind, tokens, seconds)

    def record_empty_lookup(self, seconds: float | None) -> None:
        """A lookup step whose root continued no n-gram: it ran as a plain step, and is recorded as PLAIN's
        (a plain step's work: it keeps plain steps' rate fresh, and a probe that drafted nothing says nothing
        of what lookups get when they draft) and, while LOOKUP leads, as LOOKUP's too (what choosing it gets
        now: a lookup leader whose lookups stopped finding n-grams kept the rate of its repetitive stretch,
        and full steps 1.5x faster never took the lead). Recorded as LOOKUP's alone, a lookup step that
        drafted nothing was a plain step timed against plain steps: on noise alone it beat the leader, was
        followed up and took the lead, and under the paper's sampling (drafts almost never accepted) a run
        spent a quarter of its steps verifying n-grams, 0.95x AR (session 61)."""
        if seconds is not None and self.best == LOOKUP:
            self._timed(LOOKUP, 1, max(seconds, 1e-9))
        self.record(PLAIN, 1, seconds)

    def _timed(self, kind: str, tokens: int, seconds: float) -> None:
        self._tokens(kind, tokens)
        old = self.step_seconds[kind]
        fresh = old <= 0 or self.stale(kind) or kind in self.refresh  # (old seconds: replaced, not averaged in)
        if fresh:
            self.step_seconds[kind] = seconds
            self.single.add(kind)
            self.quick.add(kind)
        elif kind in self.single:  # its second timing: the first replaced if it was paused, else the two averaged
            self.step_seconds[kind] = seconds if old > PAUSED * seconds else (old + seconds) / 2
            self.single.discard(kind)
        else:
            self.step_seconds[kind] = (1 - RATE_EMA) * old + RATE_EMA * min(seconds, OUTLIER * old)
        self.timed_at[kind] = self.steps
        self.refresh.discard(kind)

    def would_emit(self, kind: str, tokens: int) -> None:
        """The tokens a step of `kind` would have emitted in place of the step just run, known exactly (a HALF
        step's share of a FULL step's accepted path: Trie.held): its tokens per step learn without a probe; its
        seconds, only from its own steps."""
        self._tokens(kind, tokens)

    def _tokens(self, kind: str, tokens: int) -> None:
        old = self.step_tokens[kind]
        self.step_tokens[kind] = float(tokens) if old is None else (1 - RATE_EMA) * old + RATE_EMA * tokens
