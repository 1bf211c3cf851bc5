"""A read-only web viewer over a corpus: runs, a filtered task browser, one page per task, plots.

``synthloop view --corpus ROOT`` serves it (``viewer.app.serve``). Kept free of heavy imports, so the runner
can build a link to a run's page (``run_url``) without loading the web stack.
"""

from __future__ import annotations

import os
from urllib.parse import quote

VIEW_URL_ENV = "SYNTHLOOP_VIEW_URL"


def run_url(run_id: str, base: str | None = None) -> str | None:
    """The viewer's page of a run, under ``base`` (default: the ``SYNTHLOOP_VIEW_URL`` environment variable);
    None when no viewer URL is known."""
    base = base if base is not None else os.environ.get(VIEW_URL_ENV, "")
    return f"{base.rstrip('/')}/runs/{quote(run_id, safe='')}" if base else None
