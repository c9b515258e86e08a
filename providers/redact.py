"""Credentials never reach output: the userinfo of a URL (`http://user:PASS@host`) and the secrets of its query
string (`?X-Amz-Signature=...`, `?key=API_KEY`: a presigned or keyed endpoint) are replaced.

One rule, applied where text leaves the process: every ReconcileError's message (so provider
errors, plan failures and the report), the CLI's error output, and status files."""

from __future__ import annotations

import re

# scheme://userinfo@ : userinfo runs to the last '@' before the host (a raw '@' in a password
# is not valid, but it is what people type), and never over '/', '?', '#', blanks or quotes.
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s'\"<>@]*(?:@[^/?#\s'\"<>@]*)*@")
# scheme://host/path?query : in the query, the value of every parameter that carries a secret (a presigned URL's
# X-Amz-Signature / X-Amz-Credential / X-Goog-*, an Azure SAS's sig, a key=, token=, password=...). The rest stays: a
# console link's ?project= is what a message is for.
_URL_QUERY = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^?#\s'\"<>]*\?[^#\s'\"<>)\]]+")
_SECRET_PARAM = re.compile(r"([?&;](?:x-amz-[^=&;#]*|x-goog-[^=&;#]*|[^=&;#]*(?:sig|signature|token|key|secret|passw|pwd|credential|auth|session)"
                           r"[^=&;#]*)=)[^&;#]*", re.IGNORECASE)


# The environment variables that hold a credential by their name: the clouds' chains (AWS_SECRET_ACCESS_KEY,
# AWS_SESSION_TOKEN, AZURE_CLIENT_SECRET, AZURE_STORAGE_CONNECTION_STRING / _KEY / _SAS_TOKEN,
# GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_API_KEY), CI's (GITHUB_TOKEN, ACTIONS_ID_TOKEN_REQUEST_TOKEN) and any
# *_PASSWORD: a word of the name (TOKENIZERS_PARALLELISM is none), or PASSW anywhere (PGPASSWORD). Not PWD (the working
# directory).
_CREDENTIAL_NAME = re.compile(r"(?:^|_)(?:SECRETS?|TOKEN|CREDENTIALS?|CONNECTION_STRING|KEY|SAS)(?:_|$)|PASSW", re.IGNORECASE)


def credential_name(name: str) -> bool:
    """An environment variable that holds a credential, by its name."""
    return bool(_CREDENTIAL_NAME.search(name))


# Outside URLs: an Azure storage connection string's AccountKey= / SharedAccessSignature= (its sig= too), a SAS or
# shared access key given bare, and an HTTP Authorization header's credentials, as SDK errors quote them.
_SECRET_SETTING = re.compile(r"\b((?:AccountKey|SharedAccessSignature|SharedAccessKey)=)[^;\s'\"]+", re.IGNORECASE)
_AUTH_HEADER = re.compile(r"\b((?:Authorization|Proxy-Authorization)['\"]?\s*[:=]\s*['\"]?(?:Bearer|Basic|SharedKey|token)\s+)[^\s'\",}]+",
                          re.IGNORECASE)


# A secret-named parameter standing in no URL (`-o endpoint_url='notaurl?X-Amz-Signature=...'`, a bare token= or
# password=): the whole name ends with the secret's word, so max_tokens= or design= stay.
_BARE_SECRET = re.compile(r"(?<![\w.-])((?:x-amz-[\w-]*|x-goog-[\w-]*|[\w.-]*?(?:sig|signature|token|secret|password|passwd|pwd|"
                          r"credentials?|api[_-]?key|access[_-]?key))=)(['\"]?)[^&;#\s'\",)]+", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with every URL's userinfo, the secrets in its query string, a connection string's keys, a secret-named
    parameter anywhere and an Authorization header's credentials replaced by `***`."""
    if "@" in text:
        text = _USERINFO.sub(r"\1***@", text)
    if "?" in text:
        text = _URL_QUERY.sub(lambda m: _SECRET_PARAM.sub(r"\1***", m.group(0)), text)
    if "=" in text:
        text = _SECRET_SETTING.sub(r"\1***", text)
        text = _BARE_SECRET.sub(r"\1\2***", text)
    if "uthorization" in text:
        text = _AUTH_HEADER.sub(r"\1***", text)
    return text


__all__ = ["credential_name", "redact"]
