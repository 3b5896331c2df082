"""Names of dedicated endpoints: the ``ded/<slug>`` alias and the Serve app it runs as.

Kept free of every other gateway import but the wire's slug rule
(``serve_app.protocol.dedicated.SLUG_PATTERN``: the API validates a slug by it) so any route
(the responses route refuses aliases, docs/reference/responses.md#request) can ask
``is_dedicated_alias`` without pulling in the dedicated machinery.
"""

from __future__ import annotations

import re

from serve_app.protocol.dedicated import SLUG_PATTERN

ALIAS_PREFIX = "ded/"
APP_PREFIX = "ded-"
_SLUG = re.compile(SLUG_PATTERN)


def is_dedicated_alias(model: str) -> bool:
    """Whether a request's ``model`` names a dedicated endpoint (``ded/<slug>``)."""
    return model.startswith(ALIAS_PREFIX)


def alias_for(slug: str) -> str:
    return f"{ALIAS_PREFIX}{slug}"


def slug_of(alias: str) -> str | None:
    """The slug of a well-formed alias, else None (an alias that can never exist)."""
    if not is_dedicated_alias(alias):
        return None
    slug = alias[len(ALIAS_PREFIX) :]
    return slug if _SLUG.fullmatch(slug) else None


def app_name_for(slug: str) -> str:
    """The Ray Serve application of an endpoint; the reconciler owns every ``ded-*`` app."""
    return f"{APP_PREFIX}{slug}"


def is_dedicated_app(app_name: str) -> bool:
    """Apps the reconciler may delete; anything else (the ops config's apps) is never touched."""
    return app_name.startswith(APP_PREFIX)
