"""The core's error messages (the twin of ``rust/src/error.rs``): every
refusal is a ``ValueError`` carrying the same text the Rust core's
``Error`` displays, and every check runs before any state changes."""

from __future__ import annotations

import unicodedata

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
# What Rust's ``{:?}`` writes as ``\u{..}``: unprintable characters (controls,
# format, unassigned, private use, separators other than the space) and
# grapheme extenders (Mn, Me and Unicode's Other_Grapheme_Extend list).
_UNPRINTABLE = {"Cc", "Cf", "Cn", "Co", "Cs", "Zl", "Zp", "Zs", "Mn", "Me"}
_OTHER_GRAPHEME_EXTEND = [
    (0x09BE, 0x09BE), (0x09D7, 0x09D7), (0x0B3E, 0x0B3E), (0x0B57, 0x0B57),
    (0x0BBE, 0x0BBE), (0x0BD7, 0x0BD7), (0x0CC2, 0x0CC2), (0x0CD5, 0x0CD6),
    (0x0D3E, 0x0D3E), (0x0D57, 0x0D57), (0x0DCF, 0x0DCF), (0x0DDF, 0x0DDF),
    (0x1B35, 0x1B35), (0x200C, 0x200C), (0x302E, 0x302F), (0xFF9E, 0xFF9F),
    (0x1133E, 0x1133E), (0x11357, 0x11357), (0x114B0, 0x114B0), (0x114BD, 0x114BD),
    (0x115AF, 0x115AF), (0x11930, 0x11930), (0x1D165, 0x1D165), (0x1D16E, 0x1D172),
    (0xE0020, 0xE007F),
]  # fmt: skip


def _escaped(ch: str) -> bool:
    if ch == " ":
        return False
    if unicodedata.category(ch) in _UNPRINTABLE:
        return True
    c = ord(ch)
    return any(lo <= c <= hi for lo, hi in _OTHER_GRAPHEME_EXTEND)


def debug_str(s: str) -> str:
    """``s`` quoted as Rust's ``{:?}`` writes a string, so both backends'
    messages read the same."""
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif _escaped(ch):
            out.append(f"\\u{{{ord(ch):x}}}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def duplicate_request(request_id: str) -> ValueError:
    """``add_request`` with the id of a request that is still live."""
    return ValueError(f"request_id {debug_str(request_id)} is already live")


def unknown_request(request_id: str) -> ValueError:
    """A request id that names no live request."""
    return ValueError(f"request_id {debug_str(request_id)} is not a known request")


def foreign_step() -> ValueError:
    """``update_from_output`` with a step that another scheduler made."""
    return ValueError("this step was scheduled by another scheduler")


def step_already_applied() -> ValueError:
    """``update_from_output`` with a step whose output was already applied."""
    return ValueError("this step's output was already applied")
