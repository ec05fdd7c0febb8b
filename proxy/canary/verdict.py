"""The gate's verdict: treated against holdout within each tenant, no tenant steering it (pure).

A tenant can tell its arm (every answer says it) and choose what it sends in each, so the
gate must not let one tenant's figures decide for everyone:

- **Within each tenant.** Every check is a weighted sum of per-tenant differences (a tenant's
  treated sessions against its own holdout); a tenant with sessions in one arm only has no
  comparison and no weight. Pooling sessions across tenants would let a tenant's mix of arms,
  or its own conduct in one arm, pass for the policy's effect.
- **Bounded weight.** Tenants weigh as their sessions, none more than ``MAX_TENANT_WEIGHT``
  of the verdict once there are enough tenants for that (with fewer, they weigh alike).
- **No breach rests on one tenant.** With two tenants or more a check breaches only if it
  still breaches without the tenant that pulls it furthest toward a breach. A tenant alone
  in the figures is judged alone (a deployment with one key is that one tenant).

With one tenant every check is the gate's former pooled one (Newcombe's interval, the plain
bootstrap): the weighting changes nothing there. ``min_sessions`` counts every session.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from proxy.canary.gate import ArmFigures, Check, Verdict
from proxy.canary.stats import Interval, weighted_mean_difference, weighted_share_difference, z_for
from proxy.config.sections import CanaryGate

# The most of the verdict one tenant can weigh (with at least 1 / MAX_TENANT_WEIGHT tenants).
MAX_TENANT_WEIGHT = 0.25
Groups = dict[str, tuple[ArmFigures, ArmFigures]]
# A check on some tenants: its estimate, interval, budget, whether breached, and each tenant's
# pull toward a breach (its weight times its own difference).
Outcome = tuple[float, Interval, str, bool, dict[str, float]]


def by_tenant(arms: Mapping[str, ArmFigures]) -> Groups:
    """Each tenant with sessions in both arms: (its treated sessions, its holdout sessions)."""
    split: dict[str, dict[str, ArmFigures]] = {}
    for name in ("treated", "holdout"):
        for session in arms[name].sessions:
            tenant = str(session.get("tenant") or "-")
            split.setdefault(tenant, {}).setdefault(name, ArmFigures(name)).sessions.append(session)
    return {t: (a["treated"], a["holdout"]) for t, a in sorted(split.items()) if len(a) == 2}


def capped_weights(sizes: Mapping[str, float], cap: float = MAX_TENANT_WEIGHT) -> dict[str, float]:
    """Weights in proportion to ``sizes``, summing to 1, none over ``cap`` (or 1 / n when n
    tenants cannot share 1 under it): the excess of a capped tenant goes to the others."""
    if not sizes:
        return {}
    cap = max(cap, 1 / len(sizes))
    weights: dict[str, float] = {}
    free, left = dict(sizes), 1.0
    while free:
        total = sum(free.values()) or 1.0
        over = [t for t, size in free.items() if size / total * left > cap]
        if not over:
            weights.update({t: size / total * left for t, size in free.items()})
            break
        for tenant in over:
            weights[tenant] = cap
            left -= cap
            del free[tenant]
    return weights


def judge(arms: Mapping[str, ArmFigures], gate: CanaryGate) -> Verdict:
    treated, holdout = arms["treated"], arms["holdout"]
    if min(len(treated.sessions), len(holdout.sessions)) < gate.min_sessions:
        return Verdict("waiting")
    groups = by_tenant(arms)
    if not groups:
        return Verdict("waiting")
    checks = [
        _steady(name, check, groups)
        for name, check in (
            ("context_error_share", _share("context_errors", gate.max_context_error_increase, gate)),
            ("error_share", _share("errors", gate.max_error_increase, gate)),
            ("reacquisitions_per_session", _reacquisitions(gate)),
            ("cost_per_session", _cost(gate)),
        )
    ]
    return Verdict("breach" if any(c.breached for c in checks) else "pass", tuple(checks))


def _steady(name: str, check: Callable[[Groups], Outcome], groups: Groups) -> Check:
    """The check on every tenant; a breach stands only without its heaviest tenant too."""
    estimate, interval, budget, breached, pull = check(groups)
    if len(groups) >= 2:
        budget += ", also without the tenant pulling most toward it"
        if breached:
            heaviest = max(pull, key=lambda t: pull[t])
            breached = check({t: g for t, g in groups.items() if t != heaviest})[3]
    return Check(name, estimate, interval, budget, breached, tenants=len(groups))


def _weights(groups: Groups) -> dict[str, float]:
    return capped_weights({t: len(a.sessions) + len(b.sessions) for t, (a, b) in groups.items()})


def _share(key: str, limit: float, gate: CanaryGate) -> Callable[[Groups], Outcome]:
    """Error shares are hard limits: the upper bound of treated minus holdout over the limit
    breaches, once each arm has about z^2 / limit requests (0 events in 192 requests still
    leave 2 points possible); until then only a lower bound over it (plain harm)."""

    def check(groups: Groups) -> Outcome:
        weights = _weights(groups)
        cells = [
            (int(a.total(key)), int(a.total("requests")), int(b.total(key)), int(b.total("requests")))
            for a, b in groups.values()
        ]
        estimate, interval = weighted_share_difference(cells, list(weights.values()), gate.confidence)
        requests = min(sum(c[1] for c in cells), sum(c[3] for c in cells))
        enough = requests >= z_for(gate.confidence) ** 2 / limit
        breached = interval[0] > limit or (enough and interval[1] > limit)
        budget = f"upper bound <= +{limit:g}" if enough else f"lower bound <= +{limit:g} (too few requests)"
        pull = {t: w * (c[0] / c[1] - c[2] / c[3]) for (t, w), c in zip(weights.items(), cells, strict=True)}
        return estimate, interval, budget, breached, pull

    return check


def _means(
    groups: Groups,
    treated: Callable[[ArmFigures], list[float]],
    holdout: Callable[[ArmFigures], list[float]],
    ratio: float,
    gate: CanaryGate,
) -> tuple[float, Interval, dict[str, float]]:
    weights = _weights(groups)
    pairs = [(treated(a), holdout(b)) for a, b in groups.values()]
    estimate, interval = weighted_mean_difference(
        pairs, list(weights.values()), ratio=ratio, confidence=gate.confidence
    )
    pull = {
        t: w * (sum(x) / len(x) - ratio * sum(y) / len(y))
        for (t, w), (x, y) in zip(weights.items(), pairs, strict=True)
    }
    return estimate, interval, pull


def _reacquisitions(gate: CanaryGate) -> Callable[[Groups], Outcome]:
    """A trade-off: breached once the lower bound shows more than the floor and the ratio allow."""
    floor, ratio = gate.reacquisition_floor, gate.max_reacquisition_ratio

    def check(groups: Groups) -> Outcome:
        shifted = lambda arm: [r - floor for r in arm.reacquisitions()]  # noqa: E731
        estimate, interval, pull = _means(groups, shifted, ArmFigures.reacquisitions, ratio, gate)
        budget = f"lower bound of treated - {floor:g} - {ratio:g} x holdout <= 0"
        return estimate, interval, budget, interval[0] > 0, pull

    return check


def _cost(gate: CanaryGate) -> Callable[[Groups], Outcome]:
    ratio = gate.max_cost_ratio

    def check(groups: Groups) -> Outcome:
        cost: Callable[[ArmFigures], list[float]] = lambda arm: arm.per_session("cost")  # noqa: E731
        estimate, interval, pull = _means(groups, cost, cost, ratio, gate)
        budget = f"lower bound of treated - {ratio:g} x holdout <= 0"
        return estimate, interval, budget, interval[0] > 0, pull

    return check
