"""``python -m serve_app.cli``: the same as the ``gateway`` console script."""

from __future__ import annotations

import sys

from serve_app.cli import main

if __name__ == "__main__":
    sys.exit(main())
