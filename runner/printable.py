"""Untrusted text made safe for a person's terminal: control characters shown as escapes, never obeyed.

Job output, result files, the local index and a host's messages may hold terminal escapes (OSC 52 writes the
clipboard, OSC 0 the title, CSI moves the cursor or clears the screen, 8-bit C1 does the same on some
terminals; bidi controls (U+202A-U+202E, U+2066-U+2069, U+200E/U+200F) reorder what a line seems to say,
and U+2028/U+2029 break it). Every human view passes its text through `printable` where it is emitted
(cli_echo.py, the watch panel); `--json` output and MCP text pass through `printable_json` (the same JSON,
those characters as `\\uXXXX`), and `tail`/`wait` keep the log's raw bytes on purpose.
"""
from __future__ import annotations

import re

_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# The same characters but C0 (which JSON escapes itself): as JSON's own \uXXXX, so JSON text stays the same JSON.
_CONTROLS_IN_JSON = re.compile("[\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_KEPT_IN_MULTILINE = "\n\t"


def printable(text: str, *, multiline: bool = True) -> str:
    """C0 controls (ESC included), DEL, C1 (U+0080-U+009F), bidi controls and line/paragraph separators as
    `\\x1b` / `\\u009b` / `\\u202e`; newline and tab are kept where the view is multi-line. Everything else
    (any other Unicode, backslashes) is left as it is."""
    return _CONTROLS.sub(lambda m: _escape(m.group(), multiline), text)


def _escape(char: str, multiline: bool) -> str:
    if multiline and char in _KEPT_IN_MULTILINE:
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"


def printable_json(text: str) -> str:
    """JSON text (as json.dumps wrote it, C0 escaped already) with DEL, C1, bidi controls and separators written
    as JSON's `\\uXXXX` escapes: the same document, with nothing in it that a terminal would obey."""
    return _CONTROLS_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
