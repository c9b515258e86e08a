"""Credentials never reach output: the userinfo of a URL (`http://user:PASS@host`) and its query string
(`?X-Amz-Signature=...`, `?key=API_KEY`: a presigned or keyed endpoint) are replaced.

One rule, applied where text leaves the process: every ReconcileError's message (so provider
errors, plan failures and the report), the CLI's error output, and status files."""

from __future__ import annotations

import re

# scheme://userinfo@ : userinfo runs to the last '@' before the host (a raw '@' in a password
# is not valid, but it is what people type), and never over '/', '?', '#', blanks or quotes.
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s'\"<>@]*(?:@[^/?#\s'\"<>@]*)*@")
# scheme://host/path?query : the query, up to a fragment, a blank, a quote or a closing bracket of the text around it.
_QUERY = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^?#\s'\"<>]*\?)[^#\s'\"<>)\]]+")


def redact(text: str) -> str:
    """`text` with every URL's userinfo and query string replaced by `***`."""
    if "@" in text:
        text = _USERINFO.sub(r"\1***@", text)
    return _QUERY.sub(r"\1***", text) if "?" in text else text


__all__ = ["redact"]
