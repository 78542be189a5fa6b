"""A small C preprocessor for reading what macros write: object-like and function-like
``#define``s expanded, with ``#`` (stringify), ``##`` (paste) and ``__VA_ARGS__``.

Real repositories launch their template kernels from macros (a binding macro that pastes a
kernel's name from its arguments and a dispatch macro that switches over block sizes), so
the parse of the file alone never sees a kernel's instantiations. The expanded text is a view
to read them from, never a text to edit: conditionals (``#if``) keep every branch, includes
are not read (a header's defines come in through ``defines``), and nested invocations are
rescanned inside their own expansion only (enough for how macros call macros in practice).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Macro", "expand_macros", "macros_of"]

_TOKEN = re.compile(
    r"//[^\n]*|/\*.*?\*/"  # comments: one space
    r'|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''  # literals, whole
    r"|[A-Za-z_]\w*"  # identifiers
    r"|\.?\d(?:[eEpP][+-]|[\w.])*"  # numbers
    r"|##|\.\.\.|\s+|.",
    re.DOTALL,
)
_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(\w*)(.*)$")
_DEFINE = re.compile(r"([A-Za-z_]\w*)(\(([^)]*)\))?(.*)$", re.DOTALL)

MAX_OUTPUT_TOKENS = 2_000_000
"""A guard against macros that grow without end: expansion stops adding past it."""


@dataclass(frozen=True)
class Macro:
    """One ``#define``: its parameters (None for an object-like macro) and its body."""

    name: str
    params: tuple[str, ...] | None
    body: tuple[str, ...]
    variadic: bool = False


def _tokens(text: str) -> list[str]:
    return [" " if t.startswith(("//", "/*")) else t for t in _TOKEN.findall(text)]


def _logical_lines(text: str) -> list[str]:
    """The text's lines with backslash-newline continuations joined."""
    return re.sub(r"\\\r?\n", " ", text).split("\n")


def _macro(directive_text: str) -> Macro | None:
    match = _DEFINE.match(directive_text.strip())
    if match is None:
        return None
    name, has_params, params, body = match.groups()
    tokens = tuple(_tokens(body.strip()))
    if not has_params:
        return Macro(name, None, tokens)
    names = [p.strip() for p in params.split(",") if p.strip()]
    variadic = bool(names) and names[-1].endswith("...")
    if variadic:
        names[-1] = names[-1].removesuffix("...").strip() or "__VA_ARGS__"
    return Macro(name, tuple(names), tokens, variadic)


def macros_of(texts: Iterable[str]) -> tuple[dict[str, Macro], list[str]]:
    """The macros the texts define, in order (a later ``#define`` or ``#undef`` wins), and
    the last text's lines that are not directives, blank where one stood."""
    macros: dict[str, Macro] = {}
    code: list[str] = []
    for text in texts:
        code = []
        for line in _logical_lines(text):
            directive = _DIRECTIVE.match(line)
            if directive is None:
                code.append(line)
                continue
            code.append("")
            word, rest = directive.groups()
            if word == "define":
                macro = _macro(rest)
                if macro is not None:
                    macros[macro.name] = macro
            elif word == "undef":
                macros.pop(rest.strip(), None)
    return macros, code


def expand_macros(text: str, earlier: Sequence[str] = ()) -> str | None:
    """``text`` with its macros expanded (and those of ``earlier`` texts, such as the local
    headers it includes, defined first), directives removed; None when nothing is defined."""
    macros, code = macros_of([*earlier, text])
    if not macros:
        return None
    out: list[str] = []
    _Expander(macros, out).run(_tokens("\n".join(code)), frozenset())
    return "".join(out)


class _Expander:
    def __init__(self, macros: dict[str, Macro], out: list[str]) -> None:
        self.macros = macros
        self.out = out

    def run(self, tokens: Sequence[str], hidden: frozenset[str]) -> None:
        i = 0
        while i < len(tokens):
            if len(self.out) > MAX_OUTPUT_TOKENS:
                return
            token = tokens[i]
            macro = self.macros.get(token) if token not in hidden else None
            if macro is None:
                self.out.append(token)
                i += 1
                continue
            if macro.params is None:
                self.run(macro.body, hidden | {token})
                i += 1
                continue
            call = _arguments(tokens, i + 1)
            if call is None:  # a function-like macro's name alone is left as it is
                self.out.append(token)
                i += 1
                continue
            args, end = call
            self.run(self._substituted(macro, args, hidden), hidden | {token})
            i = end + 1

    def expanded(self, tokens: Sequence[str], hidden: frozenset[str]) -> list[str]:
        out: list[str] = []
        _Expander(self.macros, out).run(tokens, hidden)
        return out

    def _substituted(
        self, macro: Macro, args: list[list[str]], hidden: frozenset[str]
    ) -> list[str]:
        assert macro.params is not None
        bound = _bind(macro, args)
        body = macro.body
        result: list[str] = []
        k = 0
        while k < len(body):
            token = body[k]
            if token == "#":
                after = _next_solid(body, k + 1)
                if after is not None and body[after] in bound:
                    result.append(_stringified(bound[body[after]]))
                    k = after + 1
                    continue
            if token in bound:
                before = _last_solid(result)
                after = _next_solid(body, k + 1)
                pasted = before == "##" or (after is not None and body[after] == "##")
                arg = bound[token]
                result += _stripped(arg) if pasted else self.expanded(arg, hidden)
            else:
                result.append(token)
            k += 1
        return _pasted(result)


def _arguments(tokens: Sequence[str], start: int) -> tuple[list[list[str]], int] | None:
    """The arguments of an invocation whose ``(`` is the first solid token from ``start``,
    and the index of its ``)``; None when no ``(`` follows or it is never closed."""
    i = _next_solid(tokens, start)
    if i is None or tokens[i] != "(":
        return None
    depth = 0
    args: list[list[str]] = [[]]
    for j in range(i, len(tokens)):
        token = tokens[j]
        if token == "(":
            depth += 1
            if depth == 1:
                continue
        elif token == ")":
            depth -= 1
            if depth == 0:
                return args, j
        elif token == "," and depth == 1:
            args.append([])
            continue
        args[-1].append(token)
    return None


def _bind(macro: Macro, args: list[list[str]]) -> dict[str, list[str]]:
    assert macro.params is not None
    params = macro.params
    if args == [[]] and not params:
        return {}
    args = [_stripped(arg) for arg in args]  # an argument's outer spaces are not its own
    bound = {name: args[n] if n < len(args) else [] for n, name in enumerate(params)}
    if macro.variadic and len(args) > len(params):
        rest: list[str] = []
        for extra in args[len(params) - 1 :]:
            rest += [*([",", " "] if rest else []), *extra]
        bound[params[-1]] = rest
    return bound


def _next_solid(tokens: Sequence[str], start: int) -> int | None:
    for i in range(start, len(tokens)):
        if not tokens[i].isspace():
            return i
    return None


def _last_solid(tokens: Sequence[str]) -> str | None:
    for token in reversed(tokens):
        if not token.isspace():
            return token
    return None


def _stripped(tokens: Sequence[str]) -> list[str]:
    out = list(tokens)
    while out and out[0].isspace():
        out.pop(0)
    while out and out[-1].isspace():
        out.pop()
    return out


def _stringified(tokens: Sequence[str]) -> str:
    text = " ".join("".join(_stripped(tokens)).split())
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _pasted(tokens: list[str]) -> list[str]:
    """``a ## b`` joined into one token (spaces around ``##`` dropped)."""
    if "##" not in tokens:
        return tokens
    out: list[str] = []
    k = 0
    while k < len(tokens):
        token = tokens[k]
        if token != "##":
            out.append(token)
            k += 1
            continue
        while out and out[-1].isspace():
            out.pop()
        after = _next_solid(tokens, k + 1)
        right = tokens[after] if after is not None else ""
        left = out.pop() if out else ""
        out.append(left + right)
        k = (after if after is not None else k) + 1
    return out
