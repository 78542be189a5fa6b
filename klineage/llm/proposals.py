"""Ask a provider for a kernel change, and parse its answer strictly.

Three questions, each a prompt template under ``prompts/``:

- :func:`propose_removal`: remove one optimization from a kernel (mining);
- :func:`materialize_skill`: apply a skill card to a target kernel (replay);
- :func:`write_skill_prose`: write a skill's SKILL.md body from its evidence.

Every answer that cannot be used (a provider failure after retries, a malformed answer, a
kernel that does not compile in :func:`build_proposal`) comes back as a :class:`Rejection`
with the reason recorded, never as an exception. Only failures every later call would repeat
raise :class:`~klineage.llm.base.ProviderError`: a missing key or SDK, a refused key, an
unknown model, and a replay-only cache miss.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from klineage.kernel import KernelSource
from klineage.llm.base import Completion, Message, Provider, ProviderError, Usage
from klineage.llm.cache import CachedProvider, ResponseCache
from klineage.llm.redact import redact
from klineage.llm.templates import render
from klineage.problem.abi import AbiError, KernelAbi

if TYPE_CHECKING:
    from klineage.gate.build import Builder, BuildResult
    from klineage.problem import Definition, Problem

__all__ = [
    "ParsedAnswer",
    "Proposal",
    "Rejection",
    "build_proposal",
    "describe_problem",
    "materialize_skill",
    "parse_prose_answer",
    "parse_source_answer",
    "propose_removal",
    "write_skill_prose",
]

log = logging.getLogger("klineage.llm")

Task = Literal["remove", "materialize", "prose"]
Stage = Literal["provider", "parse", "build"]

CODE_LANGUAGES = frozenset({"cuda", "cu", "cuh", "c++", "cpp", "cxx"})
TRUNCATED = frozenset({"max_tokens", "length"})
PROSE_SECTIONS = ("## When to apply", "## How", "## Risks")
MAX_PROSE_CHARS = 8000
MAX_WORKLOADS_SHOWN = 8

_FIELD = re.compile(r"^[ \t]*(MECHANISM|INTENT|NOT APPLICABLE)[ \t]*:(.*)$", re.MULTILINE)
_MECHANISM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/ ]{0,79}$")
_OPEN_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\s`]*)[^`]*$")
_EXTERN_C = re.compile(r'extern\s+"C"')
_RUN = re.compile(r"\brun\s*\(")


@dataclass(frozen=True)
class Proposal:
    """A parsed answer: a new kernel source and what the model says it changed."""

    source: KernelSource
    """The full new kernel file."""
    mechanism: str
    """The mechanism removed (or, for a materialization, applied)."""
    intent: str
    """One line: what the change does."""
    origin: str
    """``llm:<provider>:<model>``."""
    task: Task
    """``remove`` (mining) or ``materialize`` (replay)."""
    parent: str
    """Fingerprint of the kernel the change was made to."""
    usage: Usage = field(default_factory=Usage)
    """Tokens the call consumed (0 when served from the cache)."""
    cached: bool = False
    """True when the answer came from the response cache."""
    build: BuildResult | None = None
    """Set by :func:`build_proposal` once the source compiled."""

    ok: Literal[True] = dataclasses.field(default=True, init=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a lineage edge or a report (the source by fingerprint and text)."""
        return {
            "ok": True,
            "task": self.task,
            "origin": self.origin,
            "mechanism": self.mechanism,
            "intent": self.intent,
            "parent": self.parent,
            "fingerprint": self.source.fingerprint,
            "source": self.source.text,
            "usage": dataclasses.asdict(self.usage),
            "cached": self.cached,
            "build": self.build.model_dump(mode="json") if self.build is not None else None,
        }


@dataclass(frozen=True)
class Rejection:
    """An attempt that produced nothing usable, and why."""

    reason: str
    """What was wrong, for a person to read (never contains a key)."""
    stage: Stage
    """Where it failed: the ``provider`` call, ``parse`` of the answer, or the ``build``."""
    origin: str
    """``llm:<provider>:<model>``."""
    task: Task
    """What was asked."""
    usage: Usage = field(default_factory=Usage)
    """Tokens the call consumed (an answer can be paid for and still be rejected)."""
    answer: str = ""
    """The model's raw answer, when there was one (keys scrubbed)."""
    mechanism: str | None = None
    """The mechanism named by the answer, when it got that far."""
    build: BuildResult | None = None
    """The failed build, for a ``build`` rejection."""

    ok: Literal[False] = dataclasses.field(default=False, init=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": False,
            "task": self.task,
            "origin": self.origin,
            "stage": self.stage,
            "reason": self.reason,
            "mechanism": self.mechanism,
            "answer": self.answer,
            "usage": dataclasses.asdict(self.usage),
            "build": self.build.model_dump(mode="json") if self.build is not None else None,
        }


@dataclass(frozen=True)
class ParsedAnswer:
    """The fields of a well-formed source answer."""

    mechanism: str
    intent: str
    source: str


# ---------------------------------------------------------------------------------- parsing


class _Malformed(ValueError):
    pass


def _split_fences(text: str) -> tuple[list[tuple[str, str]], str]:
    """The fenced blocks of ``text`` as (language, body), and the text outside them."""
    blocks: list[tuple[str, str]] = []
    outside: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        opening = _OPEN_FENCE.match(lines[i])
        if opening is None:
            outside.append(lines[i])
            i += 1
            continue
        fence, language = opening.group(1), opening.group(2).lower()
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        for j in range(i + 1, len(lines)):
            if closing.match(lines[j]):
                blocks.append((language, "\n".join(lines[i + 1 : j])))
                i = j + 1
                break
        else:
            raise _Malformed(
                f"the code block opened on line {i + 1} is never closed (the answer may have "
                "been cut off)"
            )
    return blocks, "\n".join(outside)


def _one_field(outside: str, name: str) -> str:
    values = [m.group(2).strip() for m in _FIELD.finditer(outside) if m.group(1) == name]
    if not values:
        raise _Malformed(f"missing the line '{name}: ...' outside the code block")
    if len(values) > 1:
        raise _Malformed(f"the line '{name}: ...' appears {len(values)} times; expected once")
    if not values[0]:
        raise _Malformed(f"the line '{name}:' is empty")
    return values[0]


def parse_source_answer(text: str, original: str | None = None) -> ParsedAnswer:
    """Parse a ``MECHANISM:`` / ``INTENT:`` / one fenced CUDA block answer.

    Raises ValueError with the reason when the answer is malformed. ``original`` is the kernel
    the change was asked for: an answer returning it unchanged is malformed too.
    """
    text = text.replace("\r\n", "\n")
    if not text.strip():
        raise _Malformed("the answer is empty")
    blocks, outside = _split_fences(text)
    declined = [
        m.group(2).strip() for m in _FIELD.finditer(outside) if m.group(1).startswith("NOT")
    ]
    if declined and not blocks:
        raise _Malformed(f"the model declined: {declined[0] or 'no reason given'}")
    if not blocks:
        raise _Malformed(
            "no fenced code block; expected exactly one ```cuda block with the full new source"
        )
    if len(blocks) > 1:
        raise _Malformed(f"{len(blocks)} fenced code blocks; expected exactly one ```cuda block")
    language, source = blocks[0]
    if language not in CODE_LANGUAGES:
        shown = f"'{language}'" if language else "no language"
        raise _Malformed(f"the code block is tagged {shown}; expected ```cuda")
    mechanism = _one_field(outside, "MECHANISM")
    if not _MECHANISM_NAME.match(mechanism):
        raise _Malformed(
            f"MECHANISM {mechanism[:80]!r} is not a short name (letters, digits, _ . - / and "
            "spaces, at most 80 characters)"
        )
    intent = _one_field(outside, "INTENT")
    if not source.strip():
        raise _Malformed("the code block is empty")
    if not _EXTERN_C.search(source) or not _RUN.search(source):
        raise _Malformed('the new source does not export extern "C" int run(...)')
    source = source.strip("\n") + "\n"
    if (
        original is not None
        and KernelSource(source).fingerprint == KernelSource(original).fingerprint
    ):
        raise _Malformed("the new source is the same as the input kernel; nothing was changed")
    return ParsedAnswer(mechanism=mechanism, intent=intent, source=source)


def parse_prose_answer(text: str) -> str:
    """Parse a skill's prose: the three required sections, in order, and nothing before them.

    One code fence wrapping the whole answer (```markdown) is taken off. Raises ValueError.
    """
    body = text.replace("\r\n", "\n").strip()
    if not body:
        raise _Malformed("the answer is empty")
    wrapped = re.fullmatch(r"```(?:markdown|md)?[ \t]*\n(.*)\n```", body, re.DOTALL)
    if wrapped:
        body = wrapped.group(1).strip()
    if len(body) > MAX_PROSE_CHARS:
        raise _Malformed(f"the prose is {len(body)} characters; at most {MAX_PROSE_CHARS}")
    headings = [line.strip() for line in body.split("\n") if line.startswith("## ")]
    for section in PROSE_SECTIONS:
        count = headings.count(section)
        if count != 1:
            raise _Malformed(
                f"the section '{section}' appears {count} times; expected once "
                f"(sections: {', '.join(PROSE_SECTIONS)})"
            )
    order = [headings.index(s) for s in PROSE_SECTIONS]
    if order != sorted(order):
        raise _Malformed(f"the sections are out of order; expected {', '.join(PROSE_SECTIONS)}")
    if not body.startswith(PROSE_SECTIONS[0]):
        raise _Malformed(
            f"text before the first section; the answer must start with '{PROSE_SECTIONS[0]}'"
        )
    try:
        _split_fences(body)
    except _Malformed as err:
        raise _Malformed(str(err)) from None
    return body + "\n"


# ---------------------------------------------------------------------------------- prompts


def describe_problem(problem: Problem | Definition) -> str:
    """The problem as Markdown for a prompt: the operation, tensors, axes, reference, sizes."""
    definition = getattr(problem, "definition", problem)
    lines = [f"- name: {definition.name} (op type: {definition.op_type})"]
    if definition.description:
        lines.append(f"- description: {definition.description}")
    axes = []
    for name, axis in definition.axes.items():
        kind = f"const = {axis.value}" if axis.type == "const" else "var"
        axes.append(f"{name} ({kind}{': ' + axis.description if axis.description else ''})")
    lines.append(f"- axes: {'; '.join(axes)}")
    for title, specs in (("inputs", definition.inputs), ("outputs", definition.outputs)):
        lines.append(f"- {title}:")
        for name, spec in specs.items():
            shape = "scalar" if spec.shape is None else f"[{', '.join(spec.shape)}]"
            extra = f", written in place of {spec.inplace_of}" if spec.inplace_of else ""
            about = f": {spec.description}" if spec.description else ""
            lines.append(f"  - {name}: {spec.dtype} {shape}{extra}{about}")
    if definition.constraints:
        lines.append(f"- constraints: {'; '.join(definition.constraints)}")
    try:
        tolerances = [
            f"{name} atol={t.atol:g} rtol={t.rtol:g}"
            for name, t in ((n, definition.tolerance_for(n)) for n in definition.outputs)
        ]
        lines.append(f"- tolerance: {'; '.join(tolerances)}")
    except (KeyError, ValueError):
        pass
    workloads = getattr(problem, "workloads", None) or []
    if workloads:
        shown = [
            " ".join(f"{k}={v}" for k, v in definition.axis_values(w).items())
            for w in workloads[:MAX_WORKLOADS_SHOWN]
        ]
        more = len(workloads) - len(shown)
        lines.append(
            f"- workloads the kernel must pass: {'; '.join(shown)}"
            + (f" (and {more} more)" if more > 0 else "")
        )
    lines.append("")
    lines.append("Reference implementation (PyTorch; the kernel must match it):")
    lines.append("")
    lines.append("```python")
    lines.append(definition.reference.rstrip("\n"))
    lines.append("```")
    return "\n".join(lines)


def _prototype(problem: Problem | Definition) -> str:
    definition = getattr(problem, "definition", problem)
    try:
        return KernelAbi.from_definition(definition).prototype
    except AbiError as err:
        return f'extern "C" int run(...)  /* the definition has no ABI: {err} */'


def _describe_detected(detected: Sequence[Any]) -> str:
    """A bullet per mechanism, with its sites underneath.

    Items are names, or objects or mappings with ``name`` or ``mechanism`` and optionally
    ``intent``, ``snippet``, ``start_line`` and ``function`` (a mechanisms ``Site`` fits).
    """
    if not detected:
        return "(none detected by the rule catalog)"
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for item in detected:
        if isinstance(item, str):
            groups.setdefault(item.strip(), ([], []))
            continue

        def get(key: str, item: Any = item) -> Any:
            return item.get(key) if isinstance(item, Mapping) else getattr(item, key, None)

        name = str(get("name") or get("mechanism") or item)
        intents, sites = groups.setdefault(name, ([], []))
        intent = get("intent")
        if intent and str(intent) not in intents:
            intents.append(str(intent))
        snippet = get("snippet")
        if snippet:
            where = f"line {get('start_line')}" if get("start_line") else "at"
            if get("function"):
                where += f" in {get('function')}"
            first = str(snippet).strip().split("\n")[0]
            sites.append(f"{where}: `{first[:160]}`")
    out: list[str] = []
    for name, (intents, sites) in groups.items():
        out.append(f"- {name}" + (f": {intents[0]}" if intents else ""))
        out.extend(f"  - {site}" for site in sites[:8])
        if len(sites) > 8:
            out.append(f"  - (and {len(sites) - 8} more sites)")
    return "\n".join(out)


def _as_text(value: str | Mapping[str, Any]) -> str:
    if isinstance(value, str):
        return value.strip()
    return "```json\n" + json.dumps(value, indent=2, default=str, ensure_ascii=False) + "\n```"


# ---------------------------------------------------------------------------------- asking


def _origin(provider: Provider) -> str:
    return f"llm:{provider.kind}:{provider.model}"


def _with_cache(provider: Provider, cache: ResponseCache | None) -> Provider:
    if cache is None or (isinstance(provider, CachedProvider) and provider.cache is cache):
        return provider
    return CachedProvider(provider, cache)


def _ask(
    provider: Provider, messages: list[Message], task: Task, options: dict[str, Any]
) -> Completion | Rejection:
    """One call; a transient provider failure becomes a Rejection, a fatal one raises."""
    try:
        return provider.complete(messages, **options)
    except ProviderError as err:
        if err.fatal:
            raise
        log.warning("%s: %s attempt failed: %s", _origin(provider), task, err.message)
        return Rejection(reason=err.message, stage="provider", origin=_origin(provider), task=task)


def _source_answer(
    provider: Provider,
    messages: list[Message],
    kernel: KernelSource,
    task: Task,
    options: dict[str, Any],
) -> Proposal | Rejection:
    answer = _ask(provider, messages, task, options)
    if isinstance(answer, Rejection):
        return answer
    origin = _origin(provider)
    try:
        if answer.finish_reason in TRUNCATED:
            raise _Malformed(
                f"the answer was cut off at the token limit (finish reason "
                f"{answer.finish_reason}); raise max_tokens"
            )
        parsed = parse_source_answer(answer.text, original=kernel.text)
    except _Malformed as err:
        reason = redact(err)
        log.info("%s: %s answer rejected: %s", origin, task, reason)
        mechanism = next(
            (m.group(2).strip() for m in _FIELD.finditer(answer.text) if m.group(1) == "MECHANISM"),
            None,
        )
        return Rejection(
            reason=reason,
            stage="parse",
            origin=origin,
            task=task,
            usage=answer.usage,
            answer=redact(answer.text, patterns=False),
            mechanism=mechanism or None,
        )
    return Proposal(
        source=KernelSource(parsed.source, name=kernel.name),
        mechanism=parsed.mechanism,
        intent=parsed.intent,
        origin=origin,
        task=task,
        parent=kernel.fingerprint,
        usage=answer.usage,
        cached=answer.cached,
    )


def propose_removal(
    provider: Provider,
    kernel: KernelSource,
    problem: Problem | Definition,
    detected: Sequence[Any] = (),
    *,
    cache: ResponseCache | None = None,
    **options: Any,
) -> Proposal | Rejection:
    """Ask for ``kernel`` with exactly one optimization mechanism removed.

    ``detected`` lists the mechanisms the rule catalog already found: names, or objects or
    mappings with ``name`` and an optional ``snippet``. ``options`` are generation options
    (``max_tokens``, ``temperature``...). With ``cache``, answers are looked up and recorded
    there.
    """
    messages = render(
        "propose_removal",
        problem=describe_problem(problem),
        prototype=_prototype(problem),
        detected=_describe_detected(detected),
        kernel_name=kernel.name,
        kernel=kernel.text.rstrip("\n"),
    )
    return _source_answer(_with_cache(provider, cache), messages, kernel, "remove", options)


def materialize_skill(
    provider: Provider,
    card: str | Mapping[str, Any],
    kernel: KernelSource,
    problem: Problem | Definition,
    *,
    cache: ResponseCache | None = None,
    **options: Any,
) -> Proposal | Rejection:
    """Ask for ``kernel`` with the skill described by ``card`` (SKILL.md text, or the skill as
    a mapping) applied."""
    messages = render(
        "materialize_skill",
        card=_as_text(card),
        problem=describe_problem(problem),
        prototype=_prototype(problem),
        kernel_name=kernel.name,
        kernel=kernel.text.rstrip("\n"),
    )
    return _source_answer(_with_cache(provider, cache), messages, kernel, "materialize", options)


def write_skill_prose(
    provider: Provider,
    evidence: str | Mapping[str, Any],
    *,
    cache: ResponseCache | None = None,
    **options: Any,
) -> str | Rejection:
    """Ask for the Markdown body of a skill (When to apply / How / Risks) from its evidence."""
    provider = _with_cache(provider, cache)
    messages = render("skill_prose", evidence=_as_text(evidence))
    answer = _ask(provider, messages, "prose", options)
    if isinstance(answer, Rejection):
        return answer
    try:
        if answer.finish_reason in TRUNCATED:
            raise _Malformed(f"the answer was cut off (finish reason {answer.finish_reason})")
        return parse_prose_answer(answer.text)
    except _Malformed as err:
        return Rejection(
            reason=redact(err),
            stage="parse",
            origin=_origin(provider),
            task="prose",
            usage=answer.usage,
            answer=redact(answer.text, patterns=False),
        )


def build_proposal(builder: Builder, proposal: Proposal) -> Proposal | Rejection:
    """Compile a proposal with the gate's build stage; a compile error is a Rejection carrying
    nvcc's message. A broken toolchain (:class:`~klineage.gate.build.BuildToolError`) raises:
    it is not the proposal's fault."""
    result = builder.build(proposal.source.text, name=proposal.source.name)
    if result.ok:
        return dataclasses.replace(proposal, build=result)
    return Rejection(
        reason=f"does not compile:\n{result.message}",
        stage="build",
        origin=proposal.origin,
        task=proposal.task,
        usage=proposal.usage,
        answer=proposal.source.text,
        mechanism=proposal.mechanism,
        build=result,
    )
