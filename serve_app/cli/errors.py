"""The error a command raises for a failure the user can fix.

Its own module so that the command modules, which ``serve_app.cli`` imports by name
when it builds the parser, never import that package back.
"""

from __future__ import annotations


class CommandError(Exception):
    """A failure the user can fix; ``main`` prints it without a traceback."""
