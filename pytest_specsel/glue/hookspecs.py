"""pytest-specsel's own hooks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

import pytest

if TYPE_CHECKING:
    from pytest_specsel.core.protocol import BackendBundle


@pytest.hookspec(firstresult=True)
def pytest_specsel_make_backend(config: pytest.Config, device: str) -> BackendBundle | None:
    """Provide the backend bundle (prober, launcher, client, scraper, memory sampler).

    The default builds the real vLLM backend; a conftest can return fakes:

    .. sourcecode:: python

        def pytest_specsel_make_backend(config, device):
            from pytest_specsel.backends.fake import fake_bundle
            return fake_bundle()
    """


def pytest_specsel_manifest_extensions(
    config: pytest.Config, manifest: Mapping[str, Any]
) -> Mapping[str, Any] | None:
    """Return a mapping merged under ``manifest["extensions"]`` (records are never mutated).

    .. sourcecode:: python

        def pytest_specsel_manifest_extensions(config, manifest):
            return {"ticket": "INF-123"}
    """
