"""Confidence intervals for the canary's gate (pure, no dependency).

- a share (errors per request): Wilson's score interval, which stays inside [0, 1] and is
  honest at 0 or n events, where the normal approximation claims certainty;
- a difference of two shares: Newcombe's hybrid score interval (method 10), built from the two
  Wilson intervals;
- a difference of two means per session (re-acquisitions, cost), ``a - ratio x b``: a
  percentile bootstrap over sessions, with a fixed seed so the same figures give the same
  verdict on every replica and every run;
- the same two, weighted over strata (the gate's tenants): ``sum w_i (a_i - b_i)`` with the
  weights summing to 1. Shares: Zou and Donner's MOVER for a linear combination of
  independent shares (each Wilson interval's distance from its share, squared, weighted by
  w_i^2), which is Newcombe's interval when there is one stratum. Means: a bootstrap that
  resamples sessions within each stratum and arm, the plain bootstrap with one stratum.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from statistics import NormalDist

Interval = tuple[float, float]


def z_for(confidence: float) -> float:
    """The two-sided normal quantile: 1.96 for 0.95."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson(events: int, trials: int, confidence: float = 0.95) -> Interval:
    if trials <= 0:
        return (0.0, 1.0)
    z = z_for(confidence)
    share = events / trials
    denominator = 1 + z * z / trials
    centre = (share + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def share_difference(
    events_a: int, trials_a: int, events_b: int, trials_b: int, confidence: float = 0.95
) -> tuple[float, Interval]:
    """``a - b`` of two shares and Newcombe's interval of it."""
    share_a = events_a / trials_a if trials_a else 0.0
    share_b = events_b / trials_b if trials_b else 0.0
    low_a, high_a = wilson(events_a, trials_a, confidence)
    low_b, high_b = wilson(events_b, trials_b, confidence)
    difference = share_a - share_b
    lower = difference - math.sqrt((share_a - low_a) ** 2 + (high_b - share_b) ** 2)
    upper = difference + math.sqrt((high_a - share_a) ** 2 + (share_b - low_b) ** 2)
    return difference, (lower, upper)


def weighted_share_difference(
    cells: Sequence[tuple[int, int, int, int]], weights: Sequence[float], confidence: float = 0.95
) -> tuple[float, Interval]:
    """``sum w_i (a_i - b_i)`` of shares given as (events_a, trials_a, events_b, trials_b)
    per stratum, and its MOVER interval (Newcombe's for one stratum of weight 1)."""
    estimate, below, above = 0.0, 0.0, 0.0
    for (events_a, trials_a, events_b, trials_b), weight in zip(cells, weights, strict=True):
        share_a, share_b = events_a / trials_a, events_b / trials_b
        low_a, high_a = wilson(events_a, trials_a, confidence)
        low_b, high_b = wilson(events_b, trials_b, confidence)
        estimate += weight * (share_a - share_b)
        below += weight * weight * ((share_a - low_a) ** 2 + (high_b - share_b) ** 2)
        above += weight * weight * ((high_a - share_a) ** 2 + (share_b - low_b) ** 2)
    return estimate, (estimate - math.sqrt(below), estimate + math.sqrt(above))


def mean_difference(
    a: Sequence[float],
    b: Sequence[float],
    *,
    ratio: float = 1.0,
    confidence: float = 0.95,
    resamples: int = 1000,
    seed: int = 20261204,
) -> tuple[float, Interval]:
    """``mean(a) - ratio x mean(b)`` and its percentile bootstrap interval."""
    return weighted_mean_difference(
        [(a, b)], [1.0], ratio=ratio, confidence=confidence, resamples=resamples, seed=seed
    )


def weighted_mean_difference(
    groups: Sequence[tuple[Sequence[float], Sequence[float]]],
    weights: Sequence[float],
    *,
    ratio: float = 1.0,
    confidence: float = 0.95,
    resamples: int = 1000,
    seed: int = 20261204,
) -> tuple[float, Interval]:
    """``sum w_i (mean(a_i) - ratio x mean(b_i))`` and its percentile bootstrap interval,
    sessions resampled within each stratum and arm."""
    if not groups or any(not a or not b for a, b in groups):
        return 0.0, (-math.inf, math.inf)
    pairs = list(zip(groups, weights, strict=True))
    estimate = sum(w * (sum(a) / len(a) - ratio * sum(b) / len(b)) for (a, b), w in pairs)
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        draw = 0.0
        for (a, b), weight in pairs:
            mean_a = sum(rng.choices(a, k=len(a))) / len(a)
            mean_b = sum(rng.choices(b, k=len(b))) / len(b)
            draw += weight * (mean_a - ratio * mean_b)
        draws.append(draw)
    draws.sort()
    tail = (1 - confidence) / 2
    lower = draws[min(len(draws) - 1, int(tail * resamples))]
    upper = draws[min(len(draws) - 1, int((1 - tail) * resamples))]
    return estimate, (lower, upper)
