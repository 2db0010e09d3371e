"""Storage URLs as the sweep prints them: never with their password (logs and terminals are read by others)."""

from __future__ import annotations


def without_password(url: str) -> str:
    """``url`` with its password shown as ``***`` (a database URL's); any other URL as it is."""
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:
        return url
    return parsed.render_as_string(hide_password=True) if parsed.password else url
