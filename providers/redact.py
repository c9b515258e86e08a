"""Credentials never reach output: the userinfo of a URL (`http://user:PASS@host`) is replaced.

One rule, applied where text leaves the process: every ReconcileError's message (so provider
errors, plan failures and the report), the CLI's error output, and status files."""

from __future__ import annotations

import re

# scheme://userinfo@ : userinfo runs to the last '@' before the host (a raw '@' in a password
# is not valid, but it is what people type), and never over '/', '?', '#', blanks or quotes.
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s'\"<>@]*(?:@[^/?#\s'\"<>@]*)*@")


def redact(text: str) -> str:
    """`text` with every URL's userinfo replaced by `***`."""
    return _USERINFO.sub(r"\1***@", text) if "@" in text else text


__all__ = ["redact"]
