"""The ``re:`` patterns of a compressed-tensors config, matched in time linear in the name.

A config's ``targets`` and ``ignore`` may hold regular expressions (``"re:.*q_proj$"``). Python's
``re`` backtracks, so a pattern from a stranger's config such as ``(.*.*)*!`` takes exponential
time on an ordinary module name. Here a pattern is parsed by Python's own parser (so it means
what it means to compressed-tensors and vLLM, which use ``re.match``), built into an automaton
without backtracking, and run over the name one character at a time, each step a set of states
(memoised, as a lazily built DFA). The cost is bounded: the automaton has at most
:data:`MAX_STATES` states and one match at most :data:`MAX_STEPS` steps.

The constructs configs use are all supported: literals, ``.``, classes, ``\\d \\w \\s``,
groups, ``|``, ``* + ? {m,n}`` (greedy or lazy: only whether a match exists matters), ``^`` and
``$``. Back-references, look-arounds, word boundaries, possessive and atomic forms and inline
flags are refused with a :class:`~arrayquant.errors.CorruptDataError`, as are patterns that do
not parse.

>>> matches("re:.*self_attn\\\\.(q|k|v)_proj$", "model.layers.0.self_attn.k_proj")
True
>>> matches("re:(.*.*)*!", "model.layers.0.self_attn.k_proj" * 4)
False
"""

from __future__ import annotations

import functools
import importlib
import re
import reprlib
from collections.abc import Callable
from typing import Any

from ..errors import CorruptDataError


def _parser_module(new: str, old: str) -> Any:
    """Python's regex parser: private from 3.11 on (the old public names warn), public before."""
    try:
        return importlib.import_module(new)
    except ImportError:  # pragma: no cover - Python 3.10
        return importlib.import_module(old)


_c = _parser_module("re._constants", "sre_constants")
_sre = _parser_module("re._parser", "sre_parse")

__all__ = ["MAX_LENGTH", "MAX_STATES", "MAX_STEPS", "check_pattern", "matches"]

MAX_STATES = 20_000  # automaton states of one pattern (a {m,n} repeat copies its body)
MAX_STEPS = 5_000_000  # state visits in one match
MAX_LENGTH = 4096  # characters of one pattern
_short = reprlib.Repr()
_short.maxstring = 80

_CATEGORIES: dict[Any, Callable[[str], bool]] = {
    _c.CATEGORY_DIGIT: lambda ch: ch.isdigit() and ch.isdecimal(),
    _c.CATEGORY_NOT_DIGIT: lambda ch: not ch.isdecimal(),
    _c.CATEGORY_SPACE: lambda ch: ch.isspace(),
    _c.CATEGORY_NOT_SPACE: lambda ch: not ch.isspace(),
    _c.CATEGORY_WORD: lambda ch: ch.isalnum() or ch == "_",
    _c.CATEGORY_NOT_WORD: lambda ch: not (ch.isalnum() or ch == "_"),
}


class _Refused(Exception):
    """A construct this matcher does not run."""


def _is(c: str) -> Callable[[str], bool]:
    return lambda ch: ch == c


def _is_not(c: str) -> Callable[[str], bool]:
    return lambda ch: ch != c


def _within(lo: int, hi: int) -> Callable[[str], bool]:
    return lambda ch: lo <= ord(ch) <= hi


def _char_set(items: list[tuple[Any, Any]]) -> Callable[[str], bool]:
    negate = bool(items) and items[0][0] is _c.NEGATE
    tests: list[Callable[[str], bool]] = []
    for op, av in items[1:] if negate else items:
        if op is _c.LITERAL:
            tests.append(_is(chr(av)))
        elif op is _c.RANGE:
            tests.append(_within(int(av[0]), int(av[1])))
        elif op is _c.CATEGORY and av in _CATEGORIES:
            tests.append(_CATEGORIES[av])
        else:
            raise _Refused(f"{op} in a character class")

    def test(ch: str) -> bool:
        return any(t(ch) for t in tests) != negate

    return test


class _Automaton:
    """Nodes: ``("char", test, next)``, ``("split", nexts)``, ``("at", kind, next)``, ``("match",)``."""

    def __init__(self, pattern: str) -> None:
        if len(pattern) > MAX_LENGTH:
            raise _Refused(f"more than {MAX_LENGTH} characters")
        parsed = _sre.parse(pattern)
        state = getattr(parsed, "state", None) or parsed.pattern  # Python 3.10 calls it "pattern"
        if state.flags & ~_c.SRE_FLAG_UNICODE:
            raise _Refused("inline flags")
        self.nodes: list[Any] = [("match",)]
        self.start = self._seq(list(parsed), 0)
        self._dfa: dict[tuple[frozenset[int], str], frozenset[int]] = {}
        self._stored = 0  # state numbers held by the memo, bounded

    def _add(self, node: Any) -> int:
        if len(self.nodes) >= MAX_STATES:
            raise _Refused(f"more than {MAX_STATES} automaton states")
        self.nodes.append(node)
        return len(self.nodes) - 1

    def _seq(self, items: list[tuple[Any, Any]], cont: int) -> int:
        for op, av in reversed(items):
            cont = self._item(op, av, cont)
        return cont

    def _item(self, op: Any, av: Any, cont: int) -> int:
        if op is _c.LITERAL:
            return self._add(("char", _is(chr(av)), cont))
        if op is _c.NOT_LITERAL:
            return self._add(("char", _is_not(chr(av)), cont))
        if op is _c.ANY:
            return self._add(("char", lambda ch: ch != "\n", cont))
        if op is _c.IN:
            return self._add(("char", _char_set(list(av)), cont))
        if op is _c.BRANCH:
            return self._add(("split", [self._seq(list(alt), cont) for alt in av[1]]))
        if op is _c.SUBPATTERN:
            _, add_flags, del_flags, body = av
            if add_flags or del_flags:
                raise _Refused("inline flags")
            return self._seq(list(body), cont)
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            low, high, body = av
            return self._repeat(low, high, body, cont)
        if op is _c.AT and av in (_c.AT_BEGINNING, _c.AT_BEGINNING_STRING, _c.AT_END, _c.AT_END_STRING):
            return self._add(("at", av, cont))
        raise _Refused(str(op))

    def _repeat(self, low: int, high: int, body: Any, cont: int) -> int:
        items = list(body)
        if high == _c.MAXREPEAT:
            loop = self._add(("split", []))
            self.nodes[loop] = ("split", [self._seq(items, loop), cont])
            cont = loop
        else:
            end = cont
            for _ in range(high - low):  # x{0,k} as (x(x(...)?)?)?
                cont = self._add(("split", [self._seq(items, cont), end]))
        for _ in range(low):
            cont = self._seq(items, cont)
        return cont

    def _closure(self, states: frozenset[int] | set[int], text: str, pos: int, budget: list[int]) -> frozenset[int]:
        """The states reached from ``states`` without reading (splits and anchors that hold at ``pos``)."""
        seen: set[int] = set()
        stack = list(states)
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            budget[0] -= 1
            node = self.nodes[s]
            if node[0] == "split":
                stack.extend(node[1])
            elif node[0] == "at" and _holds(node[1], text, pos):
                stack.append(node[2])
        if budget[0] < 0:
            raise _Refused(f"more than {MAX_STEPS} steps")
        return frozenset(seen)

    def match(self, text: str) -> bool:
        """Whether the pattern matches at the start of ``text`` (``re.match``)."""
        budget = [MAX_STEPS]
        states = self._closure({self.start}, text, 0, budget)
        for pos, ch in enumerate(text):
            if 0 in states:
                return True
            # anchors depend on the position only at the ends: memoise the steps in between
            key = (states, ch)
            memo = pos + 1 < len(text) - 1
            found = self._dfa.get(key) if memo else None
            if found is None:
                budget[0] -= len(states)
                moved = {n[2] for s in states if (n := self.nodes[s])[0] == "char" and n[1](ch)}
                found = self._closure(moved, text, pos + 1, budget)
                if memo and self._stored < MAX_STEPS:
                    self._dfa[key] = found
                    self._stored += len(states) + len(found)
            states = found
            if not states:
                return False
        return 0 in states


def _holds(kind: Any, text: str, pos: int) -> bool:
    if kind in (_c.AT_BEGINNING, _c.AT_BEGINNING_STRING):
        return pos == 0
    if kind is _c.AT_END:  # "$": the end, or before a final newline
        return pos == len(text) or (pos == len(text) - 1 and text[-1] == "\n")
    return pos == len(text)


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> _Automaton:
    try:
        return _Automaton(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        msg = f"the config pattern {_short.repr('re:' + pattern)} is not a regular expression: {exc}"
        raise CorruptDataError(msg) from None
    except _Refused as exc:
        msg = (
            f"the config pattern {_short.repr('re:' + pattern)} uses what arrayquant does not match ({exc}); "
            "config patterns may use literals, classes, groups, |, repeats, ^ and $"
        )
        raise CorruptDataError(msg) from None


def check_pattern(target: str) -> None:
    """Refuse a ``re:`` target that does not parse or that this matcher does not run; others pass."""
    if target.startswith("re:"):
        _compiled(target[3:])


def matches(target: str, name: str) -> bool:
    """Whether the config target ``target`` (``"re:<pattern>"``) matches ``name`` as ``re.match`` would.

    Raises
    ------
    CorruptDataError
        A pattern that does not parse, uses a construct not matched here, or costs more than the bounds.
    """
    automaton = _compiled(target[3:])
    try:
        return automaton.match(name)
    except _Refused as exc:
        msg = f"matching the config pattern {_short.repr(target)} against {_short.repr(name)} costs too much ({exc})"
        raise CorruptDataError(msg) from None
