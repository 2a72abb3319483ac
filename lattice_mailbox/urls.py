"""Connection URLs as they may be shown: :func:`mask_url` hides the password.

Every error, log line, CLI message and repr of this project that names a URL
shows ``mask_url(url)``: ``redis://:s3cret@host:6379/0`` -> ``redis://:**@host:6379/0``,
``postgresql://app:s3cret@db/x`` -> ``postgresql://app:**@db/x``; a query string
(which may carry ``?password=``) is left out. It is kombu's
``maybe_sanitize_url``, the helper Celery masks its own banner with; a URL
naming several hosts (``redis+cluster://:s3cret@h1:7000,h2:7001``), which kombu
cannot parse, is masked the same way here -> ``redis+cluster://:**@h1:7000,h2:7001``.
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

    try:
        return str(maybe_sanitize_url(url))
    except ValueError:  # several hosts (redis+cluster://h1:p1,h2:p2): kombu cannot parse the port
        return _mask_by_hand(url)


def _mask_by_hand(url: str) -> str:
    """``scheme://user:**@hosts/path`` without the query, for a URL kombu cannot parse."""
    scheme, sep, rest = url.partition("://")
    rest = rest.split("?", 1)[0]
    userinfo, at, hosts = rest.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":**"
    return f"{scheme}{sep}{userinfo}{at}{hosts}"


def redact_urls(text: str) -> str:
    """``text`` with every URL that carries a password replaced by :func:`mask_url`
    of it (for messages that quote a URL from elsewhere, e.g. a library's error)."""
    return _URL_WITH_PASSWORD.sub(lambda m: mask_url(m.group(0)), text)


__all__ = ["mask_url", "redact_urls"]
