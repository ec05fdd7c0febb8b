"""The one entry point through which the proxy and the replay harness apply a policy.

A policy is a named, ordered list of stages built from configuration. Building rejects
unknown stages and bad stage settings, so a typo stops the start instead of silently
compacting nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.tokens import TokenCounter


class PolicyConfigError(ValueError):
    """A policy's configuration is unusable; the message names the policy and the stage."""


@dataclass(frozen=True, slots=True)
class PolicyOutcome:
    """What a policy did to one request.

    ``messages`` is ``None`` when the request goes upstream unchanged, which lets the
    proxy forward the client's original bytes.
    """

    messages: list[Any] | None
    tokens_before: int
    tokens_after: int
    mechanisms: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.messages is not None


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    description: str
    stages: tuple[Any, ...]

    def apply(self, body: Mapping[str, Any], counter: TokenCounter) -> PolicyOutcome:
        before = counter.count_request(body).total
        return PolicyOutcome(messages=None, tokens_before=before, tokens_after=before)


# Stage builders by configuration name. Explicit: a stage exists because it is listed here.
STAGE_BUILDERS: dict[str, Any] = {}


def build_policy(name: str, description: str, stages: Sequence[Mapping[str, Any]]) -> Policy:
    built: list[Any] = []
    for index, stage in enumerate(stages):
        if not isinstance(stage, Mapping) or len(stage) != 1:
            raise PolicyConfigError(
                f"policies.{name}.stages[{index}]: each stage is a one-key mapping, "
                "e.g. `- n_latest: {n: 20}`"
            )
        ((stage_name, _stage_config),) = stage.items()
        if stage_name not in STAGE_BUILDERS:
            known = ", ".join(sorted(STAGE_BUILDERS)) or "none yet"
            raise PolicyConfigError(
                f"policies.{name}.stages[{index}]: unknown stage {stage_name!r} (known: {known})"
            )
        built.append(STAGE_BUILDERS[stage_name](_stage_config))
    return Policy(name=name, description=description, stages=tuple(built))


def build_policies(configs: Mapping[str, tuple[str, Sequence[Mapping[str, Any]]]]) -> dict[str, Policy]:
    """``{name: (description, stages)}`` to built policies."""
    return {name: build_policy(name, description, stages) for name, (description, stages) in configs.items()}
