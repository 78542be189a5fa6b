"""A base for mechanisms that remove an inline-PTX instruction by emulating it in C++.

``mma.sync``, ``ldmatrix`` and ``cp.async`` have exact scalar equivalents: warp shuffles
that gather the same fragments, plain loads and stores. Removing one of them swaps its
``asm`` statement for that emulation, wrapped in a *stash block* (see
:func:`~klineage.mechanisms._tiles_util.stash_block`) that keeps the original statement in a
comment. The forward direction's only candidates are such blocks that are still exactly the
emulation of the statement they remember, so putting the instruction back is safe (the two
compute the same thing) and restores the original text byte for byte. Any other place is
not a candidate: introducing these instructions into a kernel that never had them needs a
re-tiling that rules do not do.

A subclass implements :meth:`PtxEmulation.matches` (which asm statements are the mechanism)
and :meth:`PtxEmulation.emulation`; one whose instruction also has a C++ intrinsic form
(``__pipeline_memcpy_async``) overrides :meth:`PtxEmulation.statement` too.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from typing import Any

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.ptx import PtxInstruction
from klineage.cuda.edit import Edit
from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import NotInForm, call_arguments
from klineage.mechanisms._tiles_util import (
    AsmStatement,
    asm_statement,
    asm_statements,
    can_stash,
    reparse_statement,
    stash_block,
    stash_blocks,
)
from klineage.mechanisms.base import Carrier, Mechanism, Site


class Unsupported(Exception):
    """An asm statement of the mechanism that removal cannot emulate; the message says why."""


class PtxEmulation(Mechanism):
    """Detect asm statements of one instruction family; remove them by emulation."""

    apply_refusal: str = (
        "only a block this mechanism wrote when removing the instruction can get it back; "
        "introducing it elsewhere needs a re-tiling that only a person or an LLM does"
    )

    # -- to implement -------------------------------------------------------------------------

    @abstractmethod
    def matches(self, statement: AsmStatement) -> bool:
        """Whether an asm statement belongs to this mechanism."""

    def matches_instruction(self, instruction: PtxInstruction) -> bool:
        """Whether one parsed PTX instruction belongs to this mechanism (for instructions
        that macros issue); by default, :meth:`matches` on its mnemonic."""
        return False

    @abstractmethod
    def emulation(self, source: ParsedSource, statement: Any) -> list[str]:
        """The C++ lines computing what the statement computes; raise :class:`Unsupported`
        with a reason when the form is not one the emulation covers. ``statement`` is what
        :meth:`statement` returned."""

    def statement(self, source: ParsedSource, node: Node) -> Any | None:
        """What :meth:`emulation` reads for a statement node of this mechanism (by default
        its :class:`AsmStatement`), or None when the node is not one."""
        found = asm_statement(source, node)
        return found if found is not None and self.matches(found) else None

    def describe(self, statement: Any) -> str:
        """The instruction, for a site's detail."""
        return statement.mnemonic if isinstance(statement, AsmStatement) else str(statement)

    def statement_nodes(self, source: ParsedSource) -> Iterator[Node]:
        """The statement nodes to look at (asm statements by default)."""
        for found in asm_statements(source):
            yield found.statement

    def extra_sites(self, source: ParsedSource) -> Iterator[Site]:
        """Sites that are not asm statements (intrinsics, C++ APIs); refused by default."""
        return iter(())

    def removal_refusal(self, source: ParsedSource, statement: Any) -> str | None:
        """A reason to refuse removing a supported statement now (ordering, a need of the
        whole file), or None."""
        return None

    def apply_refusal_of(self, source: ParsedSource, block: Node) -> str | None:
        """A reason to refuse restoring a valid stash block now (ordering), or None."""
        return None

    # -- the protocol ---------------------------------------------------------------------------

    def _emulate(self, source: ParsedSource, node: Node, statement: Any) -> str:
        """The block text replacing a statement, or :class:`Unsupported`."""
        original = source.text_of(node)
        if not can_stash(original):
            raise Unsupported("the statement holds '*/' and cannot be kept in a comment")
        body = self.emulation(source, statement)
        indent = source.indent_of(node.start_byte)
        return stash_block(self.name, original, indent, body)

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        wrappers: dict[str, list[Site]] = {}
        for node in self.statement_nodes(source):
            statement = self.statement(source, node)
            if statement is None:
                continue
            refusal = None
            try:
                self._emulate(source, node, statement)
            except Unsupported as why:
                refusal = str(why)
            if refusal is None:
                refusal = self.removal_refusal(source, statement)
            found = self.site(
                source, node, detail={"instruction": self.describe(statement)}, refusal=refusal
            )
            wrappers.setdefault(found.function, []).append(found)
            yield found
        yield from self._use_sites(source, wrappers)
        yield from self._macro_sites(source)
        yield from self.extra_sites(source)

    def _macro_sites(self, source: ParsedSource) -> Iterator[Site]:
        """Calls of function-like macros that expand to this mechanism's instructions
        (``HMMA16816(...)``, ``CP_ASYNC_CG(...)``), found by the PTX model: emulated through
        the macro's expansion, the call itself kept in the stash so that restoring puts it
        back as written."""
        ptx = analysis(source).ptx
        for site in ptx.sites:
            matching = any(self.matches_instruction(i) for i in site.instructions)
            if site.via != "macro" or not matching:
                continue
            instruction = site.instructions[0]
            statement = site.node.parent
            refusal = None
            expanded = None
            if statement is None or statement.type != "expression_statement":
                refusal = str(
                    NotInForm(
                        f"{instruction.head} issued through the macro {site.name} inside an "
                        "expression",
                        "the macro called as a statement of its own",
                    )
                )
            else:
                expanded = self.macro_statement(source, statement)
                if expanded is None:
                    refusal = str(
                        NotInForm(
                            f"{instruction.head} issued through the macro {site.name}, whose "
                            "expansion is not one asm statement of this mechanism",
                            "a macro that expands to one asm statement",
                        )
                    )
            if refusal is None and expanded is not None:
                try:
                    self.emulation(*expanded)
                except Unsupported as why:
                    refusal = str(why)
                if refusal is None:
                    refusal = self.removal_refusal(source, expanded[1])
            yield self.site(
                source,
                statement if statement is not None and refusal is None else site.node,
                detail={"instruction": instruction.head, "macro": site.name},
                refusal=refusal,
            )

    def macro_statement(
        self, source: ParsedSource, statement: Node
    ) -> tuple[ParsedSource, Any] | None:
        """``(parsed expansion, statement)`` for a statement calling an assembly macro of this
        mechanism, read from its expansion; None for any other statement."""
        call = statement.named_children[0] if statement.named_children else None
        if call is None or call.type != "call_expression":
            return None
        model = analysis(source)
        expansion = model.ptx.expand(call, model.constants)
        reparsed = None if expansion is None else reparse_statement(expansion)
        if reparsed is None:
            return None
        found = asm_statement(*reparsed)
        return (reparsed[0], found) if found is not None and self.matches(found) else None

    def statement_of_text(
        self, source: ParsedSource, original: str
    ) -> tuple[ParsedSource, Any] | None:
        """What a remembered statement is (``(its source, statement)``): inline asm or an
        intrinsic read on its own, or a macro call read through the macros of ``source``."""
        reparsed = reparse_statement(original)
        if reparsed is None:
            return None
        statement = self.statement(*reparsed)
        if statement is not None:
            return reparsed[0], statement
        call = reparsed[1].named_children[0] if reparsed[1].named_children else None
        if call is None or call.type != "call_expression":
            return None
        callee = call.child_by_field_name("function")
        macro = analysis(source).ptx.macros.get(reparsed[0].text_of(callee)) if callee else None
        if macro is None:
            return None
        constants = analysis(source).constants
        args = [" ".join(reparsed[0].text_of(a).split()) for a in call_arguments(call)]
        expansion = macro.expand([str(constants[a]) if a in constants else a for a in args])
        again = (
            None if expansion is None else reparse_statement(expansion.strip().rstrip(";") + ";")
        )
        found = None if again is None else asm_statement(*again)
        return (
            (again[0], found)
            if again is not None and found is not None and self.matches(found)
            else None
        )

    def _use_sites(self, source: ParsedSource, wrappers: dict[str, list[Site]]) -> Iterator[Site]:
        """The calls of a wrapper function holding the instruction (``mma_16816(...)`` in a
        kernel): where the instruction is used. Removing one rewrites the wrapper."""
        for call in source.calls:
            inner = wrappers.get(call.name)
            caller = source.enclosing_function(call.node)
            if not inner or caller is None or caller.name == call.name:
                continue
            refusal = inner[0].refusal
            if len(inner) > 1:
                refusal = f"{call.name} holds {len(inner)} such instructions; remove them there"
            yield self.site(
                source,
                call.node,
                detail={
                    "instruction": str(inner[0].detail.get("instruction", "")),
                    "wrapper": call.name,
                },
                refusal=refusal,
            )

    def _statement_node(self, source: ParsedSource, site: Site) -> Node:
        """The statement a site removes: its own, or its wrapper's for a call site."""
        if site.node_kind != "call_expression":
            return self.node_at(source, site, "expression_statement")
        wrapper = source.function(str(site.detail.get("wrapper", "")))
        nodes = (
            []
            if wrapper is None
            else [
                n
                for n in self.statement_nodes(source)
                if wrapper.node.start_byte <= n.start_byte < wrapper.node.end_byte
                and self.statement(source, n) is not None
            ]
        )
        if len(nodes) != 1:
            raise self.refuse(f"the wrapper {site.detail.get('wrapper')} is not found", site)
        return nodes[0]

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        node = self._statement_node(source, site)
        statement = self.statement(source, node)
        expanded = None if statement is not None else self.macro_statement(source, node)
        if statement is None and expanded is None:
            raise self.refuse(f"the site is no longer a statement of {self.name}", site)
        try:
            if expanded is not None:  # a macro call: emulate its expansion, stash the call
                original = source.text_of(node)
                if not can_stash(original):
                    raise Unsupported("the statement holds '*/' and cannot be kept in a comment")
                body = self.emulation(*expanded)
                block = stash_block(self.name, original, source.indent_of(node.start_byte), body)
            else:
                block = self._emulate(source, node, statement)
        except Unsupported as why:
            raise self.refuse(str(why), site) from None
        return [Edit.replace(node, block)]

    def _valid_stash(self, source: ParsedSource, block: Node, original: str) -> str | None:
        """None when ``block`` is exactly the emulation of ``original``, else why not."""
        found = self.statement_of_text(source, original)
        if found is None:
            return f"the remembered statement is not a statement of {self.name}"
        try:
            body = self.emulation(*found)
        except Unsupported as why:
            return str(why)
        indent = source.indent_of(block.start_byte)
        if source.text_of(block) != stash_block(self.name, original, indent, body):
            return "the emulation was edited since the removal, so it may no longer match"
        return None

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for block, original in stash_blocks(source, self.name):
            refusal = self._valid_stash(source, block, original)
            if refusal is None:
                refusal = self.apply_refusal_of(source, block)
            yield self.site(
                source,
                block,
                kind="compound_statement",
                snippet=("emulated " + " ".join(original.split()))[:80],
                refusal=refusal,
            )

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        block = self.node_at(source, site, "compound_statement")
        found = next((o for b, o in stash_blocks(source, self.name) if b == block), None)
        if found is None:
            raise self.refuse(self.apply_refusal, site, "apply")
        return [Edit.replace(block, found)]
