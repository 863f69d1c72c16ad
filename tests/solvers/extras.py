"""Skipping solver tests, with a reason, when the ``solvers`` extra is not installed."""

from __future__ import annotations

import pytest

from balanceroute.solvers.base import modules_available


def needs(*modules: str) -> pytest.MarkDecorator:
    """A ``skipif`` mark naming the missing backend modules (use as ``pytestmark``)."""
    missing = [m for m in modules if not modules_available(m)]
    return pytest.mark.skipif(bool(missing), reason=f"the solvers extra is not installed "
                                                    f"(missing: {', '.join(missing)})")
