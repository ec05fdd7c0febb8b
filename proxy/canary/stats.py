"""Confidence intervals for the canary's gate (pure, no dependency).

- a share (errors per request): Wilson's score interval, which stays inside [0, 1] and is
  honest at 0 or n events, where the normal approximation claims certainty;
- a difference of two shares: Newcombe's hybrid score interval (method 10), built from the two
  Wilson intervals;
- a difference of two means per session (re-acquisitions, cost), ``a - ratio x b``: a
  percentile bootstrap over sessions, with a fixed seed so the same figures give the same
  verdict on every replica and every run.
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
    if not a or not b:
        return 0.0, (-math.inf, math.inf)
    estimate = sum(a) / len(a) - ratio * sum(b) / len(b)
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        mean_a = sum(rng.choices(a, k=len(a))) / len(a)
        mean_b = sum(rng.choices(b, k=len(b))) / len(b)
        draws.append(mean_a - ratio * mean_b)
    draws.sort()
    tail = (1 - confidence) / 2
    lower = draws[min(len(draws) - 1, int(tail * resamples))]
    upper = draws[min(len(draws) - 1, int((1 - tail) * resamples))]
    return estimate, (lower, upper)
