"""A walk without a GPU: which mechanisms some order of removals takes out of a kernel, and
why the others stay.

Mining gates every removal and goes on from the one that costs least speed. Without timing,
the plan removes one detected mechanism a step (every site its rule takes), from the state
the last step left, in mining's order where that order does not depend on timing, until no
removal takes a site:

- a removal that leaves another removable mechanism with only refused sites goes after that
  mechanism (taking it first would strand the walk);
- a removal that takes another removable mechanism along with it (one thread per row takes
  the row's reduction) stands for a costly step and goes after the others;
- ties by name.

Each step also says what the mechanism's forward rule (what replay applies to new code)
does where the step removed it: write the state before the step again (exact), write other
code the gate would judge, or refuse (mining then keeps the skill as evidence only, not
transferable). Each state after a step can be built with nvcc (the caller's ``build``,
under the problem's compile options): a removal whose code does not compile would cost
mining a gate run. The
plan is an upper bound on what mining recovers: mining also needs every step correct on every
workload, and a verified skill a measured gain.

    plan, last = plan_walk(KernelSource.from_file("expert_kernels/softmax/kernel.cu"))
    for step in plan.steps:
        print(step.mechanism, step.lines)
    for site in plan.staying:
        print(site.mechanism, site.refusal)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import BaseModel, Field

from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismError, MechanismRefused, detect_all, get
from klineage.mining.removal import Removal, reapply, remove_mechanism

__all__ = ["MAX_STEPS", "PlannedStep", "StayingSite", "WalkPlan", "plan_walk"]

MAX_STEPS = 40
"""At most this many steps a plan (each removes one mechanism everywhere)."""
NOT_TAKEN = "removable, but no step took it"


class PlannedStep(BaseModel):
    """One step of a plan: a mechanism removed at every site its rule takes."""

    mechanism: str = Field(description="the mechanism removed")
    lines: list[int] = Field(
        description="the first line of each site removed, as the rule found it (the state "
        "before the step, or the one its earlier sites left)"
    )
    build: str | None = Field(
        default=None,
        description="OK when the state after the step compiled, else the compiler's first "
        "message; None when the plan was not built",
    )
    transferable: bool = Field(
        description="whether the mechanism's forward rule applies where the step removed it "
        "(what replay does on new code); mining keeps a skill whose rule refuses as evidence "
        "only, its round trip restored from the lineage edge"
    )
    exact: bool = Field(
        description="whether that forward application wrote the state before the step again, "
        "byte for byte (else the gate judges the code it wrote)"
    )
    forward_refusal: str | None = Field(
        default=None, description="why the forward rule refused, where it did"
    )


class StayingSite(BaseModel):
    """A site still detected where the plan stops, and why its rule leaves it."""

    mechanism: str = Field(description="the mechanism detected there")
    function: str = Field(description="the function it is in")
    line: int = Field(description="its first line in the last state")
    refusal: str = Field(description="the rule's reason, with the form found and the form needed")


class WalkPlan(BaseModel):
    """What a walk without timing removes from a kernel, in order, and what it leaves."""

    kernel: str = Field(description="the kernel's name")
    steps: list[PlannedStep] = Field(description="the removals, in the order taken")
    staying: list[StayingSite] = Field(
        description="sites still detected in the last state, each with its rule's reason"
    )
    cpu_seconds: float = Field(description="CPU time the plan took (builds excluded)")

    @property
    def removed(self) -> list[str]:
        """The mechanisms removed, in order."""
        return [step.mechanism for step in self.steps]


def _stranded(kernel: KernelSource) -> set[str]:
    """Mechanisms detected in ``kernel`` whose every site the rules refuse."""
    status: dict[str, bool] = {}
    for site in detect_all(kernel):
        status[site.mechanism] = status.get(site.mechanism, False) or site.supported
    return {name for name, removable in status.items() if not removable}


def _rank(name: str, children: dict[str, KernelSource]) -> tuple[bool, bool, str]:
    """Whether removing ``name`` strands another removable mechanism, whether it takes one
    along, and the name: the order steps are chosen in, least first."""
    child = children[name]
    others = set(children) - {name}
    detected = {site.mechanism for site in detect_all(child)}
    return bool(others & _stranded(child)), bool(others - detected), name


def _step(removal: Removal) -> PlannedStep:
    """The step ``removal`` makes, with what its forward rule does where it removed."""
    lines = sorted({site.start_line for site in removal.sites})
    try:
        again = reapply(removal)
    except (MechanismRefused, MechanismError) as err:
        # a rule that fails (MechanismError) transfers no more than one that refuses
        reason = err.reason if isinstance(err, MechanismRefused) else str(err)
        return PlannedStep(
            mechanism=removal.mechanism.name,
            lines=lines,
            transferable=False,
            exact=False,
            forward_refusal=reason,
        )
    return PlannedStep(
        mechanism=removal.mechanism.name,
        lines=lines,
        transferable=True,
        exact=again.fingerprint == removal.original.fingerprint,
    )


def plan_walk(
    kernel: KernelSource,
    build: Callable[[KernelSource], str] | None = None,
    *,
    max_steps: int = MAX_STEPS,
    on_step: Callable[[PlannedStep], None] | None = None,
) -> tuple[WalkPlan, KernelSource]:
    """The plan of a walk without timing from ``kernel``, and the state it stops at.

    ``build`` compiles a state and returns "OK" or the compiler's message (it is called once
    per step); ``on_step`` is told of each step as it is taken. A rule that fails on a state
    takes nothing there (mining would log the failure and go on)."""
    started = time.process_time()
    building = 0.0
    steps: list[PlannedStep] = []
    for _ in range(max_steps):
        removals: dict[str, Removal] = {}
        for name in sorted({site.mechanism for site in detect_all(kernel)}):
            try:
                removal = remove_mechanism(kernel, get(name))
            except MechanismError:
                continue
            if removal.sites:
                removals[name] = removal
        if not removals:
            break
        children = {name: removal.simplified for name, removal in removals.items()}
        chosen = min(children, key=lambda name: _rank(name, children))
        step = _step(removals[chosen])
        kernel = children[chosen]
        if build is not None:
            before = time.process_time()
            step.build = build(kernel)
            building += time.process_time() - before
        steps.append(step)
        if on_step is not None:
            on_step(step)
    staying = [
        StayingSite(
            mechanism=site.mechanism,
            function=site.function,
            line=site.start_line,
            refusal=site.refusal or NOT_TAKEN,
        )
        for site in detect_all(kernel)
    ]
    plan = WalkPlan(
        kernel=kernel.name,
        steps=steps,
        staying=staying,
        cpu_seconds=round(time.process_time() - started - building, 3),
    )
    return plan, kernel
