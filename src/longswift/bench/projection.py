"""Pure arithmetic behind `longswift bench-steps`: the memory-bandwidth floor of a step, and the
projected time to generate N tokens from per-step costs measured at a few contexts (linear
interpolation between measured contexts; outside them the projection refuses)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import LongswiftError


def floor_seconds(weight_bytes: int, kv_bytes: int, bandwidth: float) -> float:
    """The fastest a step that reads every weight and the whole KV cache once can be: bytes / (bytes/s)."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth}")
    return (weight_bytes + kv_bytes) / bandwidth


def check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise LongswiftError(f"--alpha must be in [0, 1] (accepted draft tokens / draft positions); got {alpha}")


def tokens_per_step(alpha: float, depth: int) -> float:
    """Tokens one TokenSwift step commits, from the paper's acceptance rate: alpha = accepted draft
    tokens / `depth` draft positions, so a step emits 1 + depth * alpha (its accepted drafts and one
    token of its own)."""
    check_alpha(alpha)
    return 1.0 + depth * alpha


def integrate(xs: Sequence[float], ys: Sequence[float], a: float, b: float) -> float:
    """Integral over [a, b] of the piecewise-linear function through (xs[i], ys[i]) (xs increasing);
    [a, b] must lie within [xs[0], xs[-1]]: no extrapolation."""
    if len(xs) != len(ys) or not xs:
        raise ValueError("integrate needs as many ys as xs, at least one")
    if any(x1 <= x0 for x0, x1 in zip(xs, xs[1:])):
        raise ValueError("integrate needs increasing xs")
    if a > b:
        raise ValueError(f"integrate: a ({a}) > b ({b})")
    if a < xs[0] or b > xs[-1]:
        raise LongswiftError(f"cannot project over contexts [{a:g}, {b:g}]: costs were measured over "
                             f"[{xs[0]:g}, {xs[-1]:g}] only, and the projection does not extrapolate")
    if a == b:
        return 0.0

    def at(x: float, i: int) -> float:  # value at x inside segment i
        t = (x - xs[i]) / (xs[i + 1] - xs[i])
        return ys[i] + t * (ys[i + 1] - ys[i])

    total = 0.0
    for i in range(len(xs) - 1):
        lo, hi = max(a, xs[i]), min(b, xs[i + 1])
        if hi > lo:
            total += (hi - lo) * (at(lo, i) + at(hi, i)) / 2  # trapezoid: exact for a linear piece
    return total


@dataclass(frozen=True)
class StepCosts:
    """Seconds per step measured at increasing contexts (entries in the cache when the step runs)."""

    contexts: tuple[int, ...]
    ar: tuple[float, ...]  # one AR token: forward + LM head + sampling
    draft: tuple[float, ...]  # the draft pass (partial cache past the budget) + heads + depth logits
    verify: tuple[float, ...]  # the verify pass of the projected tree, with the LM-head rows generation computes in it
    # one row the lossless walk visits: LM head + sampling, or sampling alone where the verify pass computed its
    # logits (0 for the batched walk, whose one walk over every row steps.step_costs counts in `verify`)
    walk_row: tuple[float, ...]
    reselect: tuple[float | None, ...]  # a draft step that refills the partial cache (None below the budget)


@dataclass(frozen=True)
class Projection:
    """Projected decode time of `new_tokens` tokens after `prefix` (prefill excluded: both methods share it)."""

    prefix: int
    new_tokens: int
    alpha: float
    depth: int
    tokens_per_step: float
    ar_seconds: float
    tokenswift_seconds: float

    @property
    def speedup(self) -> float:
        return self.ar_seconds / self.tokenswift_seconds


def project(costs: StepCosts, prefix: int, new_tokens: int, alpha: float, depth: int,
            draft_budget: int | None, window: int) -> Projection:
    """AR: one step per token, so time = integral of ar(c) over c in [prefix, prefix + N].
    TokenSwift: a step at context c costs draft(c) + verify(c) + tau * walk_row(c) and advances the
    context by tau = 1 + depth * alpha, so time = integral of that / tau; past the draft budget one
    step in every `window` committed tokens also refills the partial cache, adding
    (reselect(c) - draft(c)) / window per token (`draft_budget` None: no partial cache, no refills)."""
    if prefix <= 0 or new_tokens <= 0:
        raise LongswiftError(f"the projection needs a positive prefix and token count; got {prefix} and {new_tokens}")
    if window <= 0:
        raise ValueError("window must be positive")
    tau = tokens_per_step(alpha, depth)
    xs, a, b = costs.contexts, prefix, prefix + new_tokens
    ar = integrate(xs, costs.ar, a, b)
    step = [d + v + tau * r for d, v, r in zip(costs.draft, costs.verify, costs.walk_row)]
    ts = integrate(xs, step, a, b) / tau
    lo = max(a, draft_budget if draft_budget is not None else b)
    if draft_budget is not None and lo < b:  # (lo < b only where there is a budget)
        past = [i for i, c in enumerate(xs) if c >= draft_budget]
        if any(costs.reselect[i] is None for i in past):
            raise ValueError("reselect costs are missing at contexts past the draft budget")
        extra = [costs.reselect[i] - costs.draft[i] for i in past]  # type: ignore[operator]
        if not past or xs[past[0]] > lo:
            raise LongswiftError(f"cannot project the partial-cache refills from context {lo}: the first context "
                                 f"measured past the draft budget is {xs[past[0]] if past else 'none'}")
        ts += integrate([xs[i] for i in past], extra, lo, b) / window
    return Projection(prefix, new_tokens, alpha, depth, tau, ar, ts)
