"""Untrusted text made safe for a person's terminal: control characters shown as escapes, never obeyed.

Job output, result files, the local index and a host's messages may hold terminal escapes (OSC 52 writes the
clipboard, OSC 0 the title, CSI moves the cursor or clears the screen, 8-bit C1 does the same on some
terminals). Every human view passes its text through `printable` where it is emitted (cli_echo.py, the watch
panel); `--json` output is JSON-escaped already, and `tail`/`wait` keep the log's raw bytes on purpose.
"""
from __future__ import annotations

import re

_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")
_KEPT_IN_MULTILINE = "\n\t"


def printable(text: str, *, multiline: bool = True) -> str:
    """C0 controls (ESC included), DEL and C1 (U+0080-U+009F) as `\\x1b` / `\\u009b`; newline and tab are kept
    where the view is multi-line. Everything else (any other Unicode, backslashes) is left as it is."""
    return _CONTROLS.sub(lambda m: _escape(m.group(), multiline), text)


def _escape(char: str, multiline: bool) -> str:
    if multiline and char in _KEPT_IN_MULTILINE:
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"
