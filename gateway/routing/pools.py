"""Pools: a named group of provider models' targets under one policy, usable as one step of a rule.
No I/O here.
"""

from __future__ import annotations

from typing import TypeAlias

from gateway.routing.policies import Policy
from gateway.routing.targets import Target

__all__ = ["Pool", "Step"]


class Pool:
    """A named group of provider models' targets under one policy, usable as one step of a rule."""

    __slots__ = ("name", "policy")

    def __init__(self, name: str, policy: Policy) -> None:
        self.name = name
        self.policy = policy

    @property
    def targets(self) -> tuple[Target, ...]:
        return self.policy.targets


# One step of a rule: a target tried as it is, or a pool whose policy orders its own.
Step: TypeAlias = "Target | Pool"
