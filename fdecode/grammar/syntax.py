"""What a pattern may contain, checked before compiling (docs/design.md, "Structured output").

Patterns use the Rust `regex` syntax of outlines-core, compiled to a DFA, and always match the whole
output. So a DFA's limits are errors here, each named, rather than the engine's terse message:
backreferences and lookaround are not regular, and anchors (`^`, `$`, `\\A`, `\\z`) would say what the
whole-output match already says. Groups must balance: the compiler wraps the pattern in a group of its
own, which an unbalanced `)` would escape.
"""

from __future__ import annotations

_LOOKAROUND = ("(?=", "(?!", "(?<=", "(?<!")


def excerpt(text: str, limit: int = 60) -> str:
    """`text` for an error message or a repr: its start, with '…' where it was cut."""
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def check_pattern(pattern: str) -> None:
    """Raise ValueError, naming `pattern`, where it holds a construct a whole-output DFA cannot take."""

    def fail(why: str) -> None:
        raise ValueError(f"regex {excerpt(pattern)}: {why}")

    depth, i, n = 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 == n:
                fail("ends in a lone backslash")
            e = pattern[i + 1]
            if e in "123456789" or e == "k":
                fail(f"backreference \\{e} at {i}: not a regular language")
            if e in "Az":
                fail(f"anchor \\{e} at {i}: a grammar already matches the whole output")
            i += 2
        elif c == "[":
            i = _class_end(pattern, i, fail)
        elif c == "(":
            if pattern.startswith(_LOOKAROUND, i):
                fail(f"lookaround at {i}: not supported by a DFA")
            if pattern.startswith("(?P=", i):
                fail(f"backreference at {i}: not a regular language")
            depth += 1
            i += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                fail(f"unbalanced ')' at {i}")
            i += 1
        elif c in "^$":
            fail(f"anchor {c!r} at {i}: a grammar already matches the whole output (drop it)")
        else:
            i += 1
    if depth:
        fail(f"{depth} unclosed '('")


def _class_end(pattern: str, start: int, fail) -> int:
    """The index just past the character class opening at `start` (nested classes and [:posix:] included)."""
    i, depth = _first_item(pattern, start), 1
    while depth:
        if i >= len(pattern):
            fail(f"unclosed '[' at {start}")
        c = pattern[i]
        if c == "\\":
            i += 2
        elif pattern.startswith("[:", i) and ":]" in pattern[i:]:
            i = pattern.index(":]", i) + 2
        elif c == "[":
            depth, i = depth + 1, _first_item(pattern, i)
        else:
            depth, i = depth - (c == "]"), i + 1
    return i


def _first_item(pattern: str, i: int) -> int:
    """Past the '[' at `i`, its '^' and a leading ']' (a literal there)."""
    i += 1 + pattern.startswith("^", i + 1)
    return i + pattern.startswith("]", i)
