"""Profiles of the states a mined skill compares, made when the skill is extracted.

Mining's gates profile only when asked (`ProfileConfig(every_verdict=False)`): of the many
kernels a walk gates, only the two states of each skill's step need counters. A state's
profile is kept in the lineage, so a resumed run and the other skills that share the state
do not profile it again (and the profile cache, by build, serves the rest).
"""

from __future__ import annotations

from typing import Any

from klineage.gate.profile import Profile
from klineage.lineage import LineageGraph
from klineage.problem import Problem


def state_profile(
    problem: Problem, lineage: LineageGraph, fingerprint: str, gate: Any
) -> Profile | None:
    """The state's profile: the one the lineage keeps, else made now by `gate` when it can
    profile (`profile_kernel`) and kept; None when there is none to be had."""
    state = lineage.state(fingerprint)
    if state.profile is not None:
        return state.profile
    profile_kernel = getattr(gate, "profile_kernel", None)
    if profile_kernel is None:
        return None
    kernel = problem.kernel_state(state.source)
    profile: Profile | None = profile_kernel(problem, kernel, state.latency_ms)
    if profile is not None and profile.profiled:
        lineage.set_profile(fingerprint, profile)
    return profile
