"""Connection URLs as they may be shown: :func:`mask_url` hides the password.

Every error, log line, CLI message and repr of this project that names a URL
shows ``mask_url(url)``: ``redis://:s3cret@host:6379/0`` -> ``redis://:**@host:6379/0``,
``postgresql://app:s3cret@db/x`` -> ``postgresql://app:**@db/x``; a query string
(which may carry ``?password=``) is left out. It is kombu's
``maybe_sanitize_url``, the helper Celery masks its own banner with.
"""

from __future__ import annotations

import re

_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@'\"]*:[^\s'\"]*@[^\s'\"]*")


def mask_url(url: object) -> str:
    """``url`` with its password replaced by ``**`` and without its query
    string; a value that is not a URL string comes back as ``str(url)``."""
    if not isinstance(url, str):
        return str(url)
    from kombu.utils.url import maybe_sanitize_url  # light; imported on first use

    return str(maybe_sanitize_url(url))


def redact_urls(text: str) -> str:
    """``text`` with every URL that carries a password replaced by :func:`mask_url`
    of it (for messages that quote a URL from elsewhere, e.g. a library's error)."""
    return _URL_WITH_PASSWORD.sub(lambda m: mask_url(m.group(0)), text)


__all__ = ["mask_url", "redact_urls"]
