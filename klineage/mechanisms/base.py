"""The Mechanism protocol, sites, carriers, refusals, and the registry.

A **mechanism** is one optimization that can be removed from a kernel and applied to one. It
is a small class, registered by name, in the manner of a libcst codemod: it *finds* places in
the parsed source and *describes* a rewrite as byte-range :class:`~klineage.cuda.source.Edit`\\ s.
The base class does the rest: it numbers the sites, resolves the site a caller names, applies
the edits with a re-parse (a rewrite that leaves a syntax error is refused), and checks that
the mechanism really went away (or came) afterwards.

Writing one::

    @register
    class PragmaUnroll(Mechanism):
        name = "pragma_unroll"
        category = "compute"
        family = "pragma unroll"
        intent = "Unroll a loop so its iterations overlap and its index math folds away."
        carrier_keys = {"unroll": "unroll factor; omit for full unrolling"}

        def find_sites(self, source):        # where it is present (backward)
        def find_candidates(self, source):   # where it could be added (forward)
        def removal(self, source, site):     # -> list[Edit]
        def application(self, source, site, carrier):  # -> list[Edit]
        # optional: conditions, carrier_of, default_carrier, verify_removal/_application

Build sites with :meth:`Mechanism.site`. When a site cannot be rewritten safely, either
report it with ``refusal="why"`` (``detect`` then tells the truth and ``remove`` refuses), or
raise :class:`MechanismRefused` from ``removal``/``application`` via :meth:`Mechanism.refuse`,
or raise :class:`klineage.cuda.tree.NotInForm` (the form the site is in, the form the rule
needs), which becomes the refusal.
A wrong rewrite is never an acceptable answer.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import pkgutil
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from klineage.cuda.edit import Edit, EditError, apply_edits
from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import NotInForm
from klineage.kernel import KernelSource

if TYPE_CHECKING:
    from klineage.conditions import Condition
    from klineage.problem import Problem

__all__ = [
    "CATEGORIES",
    "Carrier",
    "CarrierError",
    "Category",
    "Mechanism",
    "MechanismError",
    "MechanismRefused",
    "Refusal",
    "Site",
    "UnknownMechanism",
    "all_mechanisms",
    "detect_all",
    "get",
    "mechanism_names",
    "register",
    "remove_all",
    "remove_first",
]

Category = Literal["memory", "compute", "synchronization", "parallelism", "launch"]
CATEGORIES: tuple[str, ...] = get_args(Category)
Action = Literal["remove", "apply"]
FILE_SCOPE = "<file>"
"""The ``function`` of a site outside any function (a file-scope declaration)."""


# ---------------------------------------------------------------------------------------------
# Sites
# ---------------------------------------------------------------------------------------------


def _normalized(snippet: str) -> str:
    return " ".join(snippet.split())


class Site(BaseModel):
    """One place in a kernel where a mechanism is present (or could be applied).

    Printable as ``function:lines kind: snippet``. Its :attr:`id` depends on the mechanism,
    the function, the snippet and the occurrence, not on byte offsets: the same site keeps
    its id when unrelated code above it changes.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mechanism: str = Field(description="the registry name of the mechanism")
    function: str = Field(description=f"the enclosing function's name, or {FILE_SCOPE!r}")
    node_kind: str = Field(description="tree-sitter node kind, e.g. call_expression")
    start_byte: int = Field(ge=0, description="UTF-8 byte offset where the site starts")
    end_byte: int = Field(ge=0, description="UTF-8 byte offset where the site ends")
    start_line: int = Field(ge=1, description="1-based first line")
    end_line: int = Field(ge=1, description="1-based last line")
    snippet: str = Field(description="the site's text on one line, trimmed")
    occurrence: int = Field(
        default=0,
        ge=0,
        description="index among sites of this mechanism with the same function and snippet",
    )
    detail: dict[str, str | int] = Field(
        default_factory=dict,
        description="mechanism-specific facts (the intrinsic, the unroll factor, ...)",
    )
    refusal: str | None = Field(
        default=None,
        description="why the rewrite of this site is refused (remove for a detected site, "
        "apply for a candidate); None when it is supported",
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_computed(cls, data: Any) -> Any:
        # `id` is computed; accept dumps that include it (JSON round trip).
        if isinstance(data, Mapping) and "id" in data:
            data = {k: v for k, v in data.items() if k != "id"}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def id(self) -> str:
        """A stable short id: mechanism, function, normalized snippet, occurrence."""
        key = "\0".join(
            [self.mechanism, self.function, _normalized(self.snippet), str(self.occurrence)]
        )
        return hashlib.sha1(key.encode("utf-8")).hexdigest()[:10]

    @property
    def lines(self) -> str:
        """``12`` or ``12-14``."""
        if self.start_line == self.end_line:
            return str(self.start_line)
        return f"{self.start_line}-{self.end_line}"

    @property
    def supported(self) -> bool:
        return self.refusal is None

    def overlaps_lines(self, start: int, end: int) -> bool:
        """Whether the site shares a line with the 1-based range [start, end]."""
        return self.start_line <= end and start <= self.end_line

    def __str__(self) -> str:
        return f"{self.function}:{self.lines} {self.node_kind}: {self.snippet}"


# ---------------------------------------------------------------------------------------------
# Carriers
# ---------------------------------------------------------------------------------------------

CarrierValue = int | float | bool | str
_INT = re.compile(r"^[+-]?\d+$")


class CarrierError(ValueError):
    """A carrier value has the wrong type for the key (``apply`` turns it into a refusal)."""


class Carrier(BaseModel):
    """The instance choices of one application of a mechanism.

    The common choices are named fields; a mechanism may accept other keys too (listed in its
    ``carrier_keys``). Values are JSON scalars. ``Carrier.from_pairs(["unroll=4"])`` reads the
    command line's ``--carrier k=v``.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    vector_width: int | None = Field(
        default=None, gt=0, description="elements per vector load/store (2, 4, 8)"
    )
    tile_size: int | None = Field(default=None, gt=0, description="elements per tile side")
    block_size: int | None = Field(default=None, gt=0, description="threads per block")
    unroll: int | None = Field(default=None, gt=0, description="loop unroll factor")
    stages: int | None = Field(default=None, gt=0, description="pipeline stages")

    @model_validator(mode="after")
    def _scalar_extras(self) -> Carrier:
        for key, value in (self.model_extra or {}).items():
            if not isinstance(value, CarrierValue):
                raise ValueError(f"carrier value {key}={value!r} must be a number, bool or text")
        return self

    @classmethod
    def from_pairs(cls, pairs: Iterable[str]) -> Carrier:
        """``["unroll=4", "note=x"]`` -> Carrier; integers, true/false, floats and text."""
        values: dict[str, CarrierValue] = {}
        for pair in pairs:
            key, sep, raw = pair.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ValueError(f"carrier {pair!r} is not key=value (e.g. unroll=4)")
            values[key] = _parse_value(raw.strip())
        return cls(**values)

    def as_dict(self) -> dict[str, CarrierValue]:
        """The values that are set (None left out)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}

    def keys(self) -> list[str]:
        return list(self.as_dict())

    def __contains__(self, key: object) -> bool:
        return key in self.as_dict()

    def __getitem__(self, key: str) -> CarrierValue:
        values = self.as_dict()
        if key not in values:
            raise KeyError(f"carrier has no {key!r}; it holds: {', '.join(values) or 'nothing'}")
        return values[key]

    def items(self) -> list[tuple[str, CarrierValue]]:
        return list(self.as_dict().items())

    def get(self, key: str, default: CarrierValue | None = None) -> CarrierValue | None:
        return self.as_dict().get(key, default)

    def get_int(self, key: str, default: int | None = None) -> int | None:
        """An integer choice; :class:`CarrierError` when the value is not an integer."""
        value = self.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise CarrierError(f"carrier {key}={value!r} must be an integer")
        return value

    def get_str(self, key: str, default: str | None = None) -> str | None:
        value = self.get(key)
        return default if value is None else str(value)

    def merged(self, other: Carrier | Mapping[str, CarrierValue] | None) -> Carrier:
        """This carrier with ``other``'s values on top."""
        if other is None:
            return self
        extra = other.as_dict() if isinstance(other, Carrier) else dict(other)
        return Carrier(**{**self.as_dict(), **extra})

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.as_dict().items()) or "(defaults)"


def _parse_value(raw: str) -> CarrierValue:
    if _INT.match(raw):
        return int(raw)
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    try:
        return float(raw)
    except ValueError:
        return raw


# ---------------------------------------------------------------------------------------------
# Refusals and errors
# ---------------------------------------------------------------------------------------------


class Refusal(BaseModel):
    """Why a mechanism declined a rewrite: recorded with the lineage, shown to people."""

    model_config = ConfigDict(frozen=True)

    mechanism: str = Field(description="the mechanism that refused")
    action: Action = Field(description="what was asked")
    site: str | None = Field(default=None, description="the site, printed; None if none")
    reason: str = Field(min_length=1, description="why, in one sentence")

    def __str__(self) -> str:
        where = f" at {self.site}" if self.site else ""
        return f"{self.mechanism}: cannot {self.action}{where}: {self.reason}"


class MechanismRefused(Exception):
    """A mechanism declined to rewrite a site; ``reason`` says why. An honest answer."""

    def __init__(self, refusal: Refusal) -> None:
        self.refusal = refusal
        super().__init__(str(refusal))

    @property
    def reason(self) -> str:
        return self.refusal.reason


class MechanismError(RuntimeError):
    """A mechanism's rewrite did not do what it claims: a bug in the mechanism."""


class UnknownMechanism(LookupError):
    """No mechanism is registered under a name; the message lists the known ones."""


# ---------------------------------------------------------------------------------------------
# The protocol
# ---------------------------------------------------------------------------------------------


class Mechanism(ABC):
    """One optimization that can be removed from a kernel and applied to one.

    Subclasses set the class attributes and implement the four ``find_*``/rewrite methods;
    the public methods (:meth:`detect`, :meth:`remove`, :meth:`candidates`, :meth:`apply`,
    :meth:`conditions`) are the protocol the rest of klineage uses.
    """

    name: ClassVar[str]
    """Registry name, snake_case: ``pragma_unroll``."""
    category: ClassVar[Category]
    """memory, compute, synchronization, parallelism or launch."""
    family: ClassVar[str]
    """The DESIGN.md family it belongs to: ``pointer qualifiers``, ``fast math``..."""
    intent: ClassVar[str]
    """One sentence: what the optimization buys."""
    requires: ClassVar[tuple[str, ...]] = ()
    """Mechanisms that must be present for this one to apply."""
    conflicts: ClassVar[tuple[str, ...]] = ()
    """Mechanisms that cannot be present together with this one."""
    carrier_keys: ClassVar[dict[str, str]] = {}
    """Carrier keys ``apply`` reads -> what each means. Other keys are refused."""
    signature: ClassVar[tuple[str, ...]] = ()
    """What removing it must change in the machine code, as features of
    :func:`klineage.gate.sass.feature_counts`: instruction families (``SHFL``, ``LDGSTS``),
    ``global_width`` (load/store widths), ``constant`` (read-only loads) or ``host`` (the host
    launch). Mining flags an accepted removal whose SASS delta shows none of them; empty: the
    mechanism declares none (unrolling, qualifiers: any change of the code will do)."""
    relieves: ClassVar[tuple[str, ...]] = ()
    """Profile figures (keys of :data:`klineage.gate.counters.CALL_FIGURES`) it exists to
    lower, such as shared-memory bank conflicts for padding; where a profiled target shows
    none of them, replay tries it last (it has nothing to relieve there)."""
    fills_threads: ClassVar[bool] = False
    """It gives work that one thread did to several (a block or a warp per row, a sum split
    over blocks): where the
    target already launches enough threads to fill the GPU on every workload, replay tries it
    last, profile or not (:func:`klineage.replay.relief.enough_threads`)."""
    spreads_loop: ClassVar[str | None] = None
    """Where it sends the iterations of a thread's reduction loop: ``lanes`` (a warp or a
    block per row: consecutive lanes take consecutive iterations) or ``blocks`` (a split:
    each block takes a chunk, a thread's lanes unchanged); None for neither. Replay races
    such rivals in the order the target's loads favor
    (:func:`klineage.replay.coalescing.loop_spread`)."""
    stages_loads: ClassVar[bool] = False
    """It routes global loads through shared memory (tiles a block reads many times, or a
    transposed read made coalesced): where the target's loads are reused across threads or
    strided across lanes, replay tries it first, whatever the expert it was mined from gained
    (:func:`klineage.replay.coalescing.calls_for_staging`)."""

    # -- to implement -------------------------------------------------------------------------

    @abstractmethod
    def find_sites(self, source: ParsedSource) -> Iterable[Site]:
        """Where the optimization is present. Build each with :meth:`site`."""

    @abstractmethod
    def find_candidates(self, source: ParsedSource) -> Iterable[Site]:
        """Where the optimization could be added. Build each with :meth:`site`."""

    @abstractmethod
    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        """The edits that remove the optimization at a detected ``site``."""

    @abstractmethod
    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        """The edits that add the optimization at a candidate ``site`` with ``carrier``."""

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        """What must hold for the optimization at ``site`` to be valid (static, no run)."""
        return []

    def run_time_check(
        self, kernel: KernelSource, site: Site, condition: Condition
    ) -> Carrier | None:
        """The carrier under which the rewrite at a candidate ``site`` tests ``condition`` at
        run time (keeping the unoptimized path for what fails it) instead of requiring it;
        None when the condition must hold."""
        return None

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        """The instance choices of a *detected* site (``#pragma unroll 4`` -> unroll=4), so
        that removing it and applying with this carrier gives the kernel back."""
        return Carrier()

    def default_carrier(self, kernel: KernelSource, site: Site) -> Carrier:
        """The choices :meth:`apply` uses for keys the caller leaves out."""
        return Carrier()

    def alternative_carriers(self, kernel: KernelSource) -> list[Carrier]:
        """Choices beside the default worth a gate run on ``kernel`` once a carrier of this
        mechanism is kept there (replay races them): none unless a rule says which."""
        return []

    # -- the protocol -------------------------------------------------------------------------

    def detect(self, kernel: KernelSource) -> list[Site]:
        """Where the optimization is present (backward direction), in document order."""
        return self._finish(self.find_sites(kernel.parsed))

    def candidates(self, kernel: KernelSource) -> list[Site]:
        """Where the optimization could be added (forward direction), in document order."""
        return self._finish(self.find_candidates(kernel.parsed))

    def remove(self, kernel: KernelSource, site: Site) -> KernelSource:
        """The same program without the optimization at ``site`` (a detected site).

        Raises :class:`MechanismRefused` with a reason when the site is not detected in this
        kernel, is unsupported, or the rewrite would not parse.
        """
        before = self.detect(kernel)
        found = self._resolve(kernel, site, before, "remove")
        if found.refusal:
            raise self.refuse(found.refusal, found, "remove")
        try:
            edits = self.removal(kernel.parsed, found)
        except NotInForm as err:
            raise self.refuse(str(err), found, "remove") from err
        result = self._rewrite(kernel, edits, found, "remove")
        self.verify_removal(kernel, result, found, before)
        return result

    def unknown_carrier_keys(self, carrier: Carrier) -> list[str]:
        """The keys of `carrier` this mechanism has no use for (see `carrier_keys`)."""
        return [k for k in carrier.as_dict() if k not in self.carrier_keys]

    def apply(
        self, kernel: KernelSource, site: Site, carrier: Carrier | None = None
    ) -> KernelSource:
        """The program with the optimization added at ``site`` (a candidate site).

        ``carrier`` holds the instance choices; keys left out come from
        :meth:`default_carrier`. Raises :class:`MechanismRefused` with a reason when the site
        is not a candidate, a choice is missing or invalid, or the rewrite would not parse.
        """
        candidates = self.candidates(kernel)
        found = self._resolve(kernel, site, candidates, "apply")
        if found.refusal:
            raise self.refuse(found.refusal, found, "apply")
        carrier = carrier or Carrier()
        unknown = self.unknown_carrier_keys(carrier)
        if unknown:
            accepted = ", ".join(self.carrier_keys) or "none"
            raise self.refuse(
                f"unknown carrier key(s) {', '.join(unknown)}; {self.name} accepts: {accepted}",
                found,
                "apply",
            )
        effective = self.default_carrier(kernel, found).merged(carrier)
        try:
            edits = self.application(kernel.parsed, found, effective)
        except (CarrierError, NotInForm) as err:
            raise self.refuse(str(err), found, "apply") from err
        result = self._rewrite(kernel, edits, found, "apply")
        self.verify_application(kernel, result, found, candidates)
        return result

    # -- checks after a rewrite (override when the counts do not tell) -----------------------

    def verify_removal(
        self, before: KernelSource, after: KernelSource, site: Site, sites: list[Site]
    ) -> None:
        """Raise :class:`MechanismError` unless the removal made the site go away."""
        if len(self.detect(after)) >= len(sites):
            raise MechanismError(
                f"{self.name}: removing {site} left as many detected sites as before"
            )

    def verify_application(
        self, before: KernelSource, after: KernelSource, site: Site, candidates: list[Site]
    ) -> None:
        """Raise :class:`MechanismError` unless the application took effect."""
        if len(self.candidates(after)) >= len(candidates) and len(self.detect(after)) <= len(
            self.detect(before)
        ):
            raise MechanismError(
                f"{self.name}: applying at {site} changed neither the "
                "candidates nor the detected sites"
            )

    # -- helpers for subclasses ---------------------------------------------------------------

    def site(
        self,
        source: ParsedSource,
        node: Node,
        *,
        detail: Mapping[str, str | int] | None = None,
        refusal: str | None = None,
        span: tuple[int, int] | None = None,
        snippet: str | None = None,
        kind: str | None = None,
    ) -> Site:
        """A site at ``node`` (or at the byte ``span``), with its function, lines and snippet."""
        start, end = span if span is not None else (node.start_byte, node.end_byte)
        function = source.enclosing_function(node)
        return Site(
            mechanism=self.name,
            function=function.name if function is not None else FILE_SCOPE,
            node_kind=kind or node.type,
            start_byte=start,
            end_byte=end,
            start_line=source.line_of(start),
            end_line=source.line_of(max(start, end - 1)),
            snippet=snippet if snippet is not None else source.snippet((start, end)),
            detail=dict(detail or {}),
            refusal=refusal,
        )

    def refuse(
        self, reason: str, site: Site | None = None, action: Action = "remove"
    ) -> MechanismRefused:
        """A :class:`MechanismRefused` to raise: ``raise self.refuse("why", site, "apply")``."""
        return MechanismRefused(
            Refusal(
                mechanism=self.name,
                action=action,
                site=str(site) if site is not None else None,
                reason=reason,
            )
        )

    @staticmethod
    def node_at(source: ParsedSource, site: Site, *kinds: str) -> Node:
        """The node a site was built from (its kind and byte range), found again."""
        wanted = kinds or (site.node_kind,)
        node = source.root.descendant_for_byte_range(site.start_byte, site.end_byte)
        while node is not None:
            if node.type in wanted and node.start_byte <= site.start_byte:
                return node
            node = node.parent
        raise MechanismError(f"no {'/'.join(wanted)} node at {site}")

    # -- internals ------------------------------------------------------------------------------

    def _finish(self, sites: Iterable[Site]) -> list[Site]:
        """Sort by position, drop duplicates, number occurrences of equal snippets."""
        ordered: list[Site] = []
        seen: set[tuple[int, int]] = set()
        for site in sorted(sites, key=lambda s: (s.start_byte, s.end_byte)):
            if (site.start_byte, site.end_byte) in seen:
                continue
            seen.add((site.start_byte, site.end_byte))
            ordered.append(site)
        counts: dict[tuple[str, str], int] = {}
        numbered = []
        for site in ordered:
            key = (site.function, _normalized(site.snippet))
            index = counts.get(key, 0)
            counts[key] = index + 1
            numbered.append(
                site if index == site.occurrence else site.model_copy(update={"occurrence": index})
            )
        return numbered

    def _resolve(self, kernel: KernelSource, site: Site, sites: list[Site], action: Action) -> Site:
        if site.mechanism != self.name:
            raise self.refuse(
                f"the site belongs to mechanism {site.mechanism!r}, not {self.name!r}",
                site,
                action,
            )
        for known in sites:
            if known.id == site.id:
                return known
        for known in sites:
            if (known.start_byte, known.end_byte) == (site.start_byte, site.end_byte):
                return known
        what = "detected" if action == "remove" else "candidate"
        listed = "; ".join(str(s) for s in sites[:5]) or "none"
        raise self.refuse(
            f"{site} is not a {what} site in {kernel.name} ({len(sites)} {what}: {listed})",
            site,
            action,
        )

    def _rewrite(
        self, kernel: KernelSource, edits: list[Edit], site: Site, action: Action
    ) -> KernelSource:
        if not edits:
            raise MechanismError(f"{self.name}: {action} at {site} produced no edits")
        try:
            return apply_edits(kernel.parsed, edits)
        except EditError as err:
            raise self.refuse(f"the rewrite would not parse: {err}", site, action) from err

    def __repr__(self) -> str:
        return f"<mechanism {self.name} ({self.category})>"


class DetectOnly(Mechanism):
    """A mechanism the rules find but do not rewrite (a re-tiling, say): every site is refused
    with ``refusal``, and there are no candidates."""

    refusal: ClassVar[str]
    """Why no rule removes or applies it."""

    def find_candidates(self, source: ParsedSource) -> Iterable[Site]:
        return iter(())

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        raise self.refuse(self.refusal, site)

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        raise self.refuse(self.refusal, site, "apply")


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------

_REGISTRY: dict[str, Mechanism] = {}
_LOADED = False
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def register(cls: type[Mechanism]) -> type[Mechanism]:
    """Class decorator: check the class attributes and register one instance by name."""
    for attribute in ("name", "category", "family", "intent"):
        if not getattr(cls, attribute, None):
            raise TypeError(f"mechanism {cls.__name__} must set {attribute!r}")
    if not _NAME.match(cls.name):
        raise TypeError(f"mechanism name {cls.name!r} must be snake_case")
    if cls.category not in CATEGORIES:
        raise TypeError(
            f"mechanism {cls.name}: category {cls.category!r} is not one of {', '.join(CATEGORIES)}"
        )
    existing = _REGISTRY.get(cls.name)
    if existing is not None and type(existing).__qualname__ != cls.__qualname__:
        raise TypeError(f"mechanism name {cls.name!r} is already taken by {type(existing)}")
    _REGISTRY[cls.name] = cls()
    return cls


def _load_builtin() -> None:
    """Import every module of this package once, so their @register decorators run.

    A new mechanism needs no list to be edited: a module in ``klineage/mechanisms/`` whose
    name does not start with ``_`` is found here.
    """
    global _LOADED
    if _LOADED:
        return
    import klineage.mechanisms as package

    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not module.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{module.name}")
    _LOADED = True


def get(name: str) -> Mechanism:
    """The mechanism registered as ``name``; :class:`UnknownMechanism` lists the known ones."""
    _load_builtin()
    if name in _REGISTRY:
        return _REGISTRY[name]
    close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UnknownMechanism(
        f"unknown mechanism {name!r}{hint}; known mechanisms: {', '.join(sorted(_REGISTRY))}"
    )


def all_mechanisms() -> list[Mechanism]:
    """Every registered mechanism, sorted by name."""
    _load_builtin()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def mechanism_names() -> list[str]:
    return [m.name for m in all_mechanisms()]


def detect_all(
    kernel: KernelSource, mechanisms: Iterable[str | Mechanism] | None = None
) -> list[Site]:
    """The sites of every mechanism (or of the given ones), in document order."""
    chosen = all_mechanisms() if mechanisms is None else [_as_mechanism(m) for m in mechanisms]
    sites = [site for mechanism in chosen for site in mechanism.detect(kernel)]
    return sorted(sites, key=lambda s: (s.start_byte, s.end_byte, s.mechanism))


def _as_mechanism(mechanism: str | Mechanism) -> Mechanism:
    return mechanism if isinstance(mechanism, Mechanism) else get(mechanism)


def remove_first(kernel: KernelSource, mechanism: str | Mechanism) -> KernelSource:
    """The kernel with the first removable site of ``mechanism`` removed; unchanged when the
    mechanism is absent (or every site refuses)."""
    chosen = _as_mechanism(mechanism)
    for site in chosen.detect(kernel):
        if site.supported:
            try:
                return chosen.remove(kernel, site)
            except MechanismRefused:
                continue
    return kernel


def remove_all(kernel: KernelSource, mechanism: str | Mechanism) -> KernelSource:
    """The kernel with every removable site of ``mechanism`` removed, one at a time; unchanged
    when the mechanism is absent."""
    chosen = _as_mechanism(mechanism)
    current = kernel
    for _ in range(10_000):  # each removal lowers the count; this only guards a buggy mechanism
        following = remove_first(current, chosen)
        if following is current:
            return current
        current = following
    raise MechanismError(f"{chosen.name}: remove_all did not finish")
