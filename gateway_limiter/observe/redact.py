"""Passwords out of whatever is shown: log lines, error messages, ``status`` output.

Every URL the limiter is given (database, Redis) may carry a password; anything that
prints a URL or a driver's complaint about one passes it through here first.
"""

from __future__ import annotations

import re

# user:password@ in a URL's authority, with or without a scheme in front of it.
_PASSWORD_IN_URL = re.compile(
    r"(?P<head>(?:[a-z0-9+.-]+://|^|(?<=[\s'\"(=]))[^:/@\s'\"=]*:)"
    # greedy: a password with a raw "@" in it is masked up to the last "@"
    r"(?P<secret>(?!//)[^\s'\"]*)(?P<tail>@)",
    re.IGNORECASE,
)
# password=... in a query string: redis-py and the database drivers read it there too.
_PASSWORD_PARAM = re.compile(
    r"(?P<head>[?&;](?:password|passwd|pwd)=)(?P<secret>[^&#\s'\"]*)", re.IGNORECASE
)
# A text that begins with scheme:// is taken for one URL and masked exactly.
_URL_START = re.compile(r"\s*[a-z][a-z0-9+.-]*://", re.IGNORECASE)


def mask_url(url: str) -> str:
    """One URL (nothing around it) with its password shown as ``***``, read as the
    parsers read it, with or without a scheme.

    SQLAlchemy takes the password from the first ":" of the user part to the *last*
    "@", whatever lies between (spaces, quotes, "/"); redis-py (urllib) to the last "@"
    of the authority. Masking to the last "@" of the whole URL covers both.
    """
    head, sep, rest = url.partition("://")
    if not sep:
        head, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if at and colon and "/" not in user:
        rest = f"{user}:***@{host}"
    return _PASSWORD_PARAM.sub(r"\g<head>***", f"{head}{sep}{rest}")


# What a parser quotes of the URL at the end of its complaint ("... as 'x'", ": 'x'").
_QUOTED_TAIL = re.compile(r"(?:\s+as|:)?\s*['\"].*$", re.DOTALL)


def url_error(url: str, error: BaseException) -> str:
    """``url`` (masked) and a parser's complaint about it, fit to show.

    A parser that misreads a URL quotes the piece it choked on, and with a password
    holding "@" or ":" that piece may be part of the password: when the URL has
    credentials, what the parser quoted is left out (the masked URL shows the rest).
    """
    masked = mask_url(url)
    why = str(error)
    if masked != url:
        why = _QUOTED_TAIL.sub("", why) or type(error).__name__
    return f"{masked}: {mask_secrets(why)}"


def mask_secrets(text: str) -> str:
    """Return ``text`` with any password inside a URL replaced by ``***``.

    A text that is a URL (it begins with ``scheme://``) is masked exactly, as
    ``mask_url`` does, whatever characters its password holds; in other text a
    password is recognised up to a space or a quote. ``password=`` in a query string
    is masked in both.
    """
    if _URL_START.match(text):
        text = mask_url(text)
    text = _PASSWORD_IN_URL.sub(r"\g<head>***\g<tail>", text)
    return _PASSWORD_PARAM.sub(r"\g<head>***", text)
