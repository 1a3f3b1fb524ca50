"""Repo-level test wiring: every test under tests/ that is not e2e or gpu is a logic test
(marker ``cpu``), so ``pytest -m cpu`` runs the logic suite alone."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests" not in item.path.parts:
            continue
        if not any(item.get_closest_marker(m) for m in ("e2e", "gpu")):
            item.add_marker(pytest.mark.cpu)
