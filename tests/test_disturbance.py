"""Interference is seen: the host's load and the server log's events over a round flag it,
and a pair with a flagged round is measured once more as a whole pair, the first kept."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_specsel.core.disturbance import HostLoad
from pytest_specsel.core.disturbance import log_events
from pytest_specsel.core.interleave import disturbance_reasons
from pytest_specsel.core.interleave import run_pairs
from pytest_specsel.core.intervals import RoundPolicy
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import ScenarioFigures
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import Thresholds

pytestmark = pytest.mark.cpu

QUIET = HostLoad(10.0, 2, 0.0, 0.45, 0.02)


def test_steal_or_load_from_elsewhere_flags_the_host_and_a_log_event_flags_the_server():
    assert QUIET.flags() == ()
    assert HostLoad(10.0, 2, 0.06, 0.45, 0.02).flags() == ("host_disturbed",)  # the hypervisor took 6 %
    assert HostLoad(10.0, 2, 0.0, 0.45, 0.12).flags() == ("host_disturbed",)  # others used 12 %
    assert HostLoad(10.0, 2, 0.0, 0.95, 0.0).flags() == ()  # our own load is no disturbance
    events = HostLoad(10.0, 2, 0.0, 0.4, 0.0, ("recompile: ...",))
    assert events.flags() == ("server_log_event",)
    assert events.to_json()["disturbed"] is False


def test_recompile_and_preemption_lines_of_a_vllm_log_are_found_and_stats_lines_are_not():
    text = "\n".join(
        [
            "(APIServer pid=1) INFO 12-05 12:00:01 [loggers.py:257] Engine 000: Avg prompt throughput: "
            "20.1 tokens/s, Avg generation throughput: 30.2 tokens/s, Running: 1 reqs, Waiting: 0 reqs",
            "(EngineCore pid=2) INFO 12-05 12:00:02 [backends.py:398] Compiling a graph for compile range "
            "(1, 8) takes 4.21 s",
            "(APIServer pid=1) INFO 12-05 12:00:03 [loggers.py:257] Engine 000: Running: 4 reqs, "
            "Waiting: 2 reqs, Preemptions: 3",
            'INFO:     127.0.0.1:50000 - "POST /v1/completions HTTP/1.1" 200 OK',
        ]
    )
    found = log_events(text)
    assert [f.split(":", 1)[0] for f in found] == ["recompile", "preemption"]
    assert "compile range (1, 8)" in found[0]
    assert log_events("INFO: Engine 000: Running: 1 reqs, Waiting: 0 reqs") == ()


def _arm(role, hosts, order):
    """Rounds of one arm; ``hosts[i]`` is the host reading of its i-th round as run."""
    runs = []

    def run(index):
        order.append(role.value[0])
        host = hosts[len(runs)] if len(runs) < len(hosts) else QUIET
        runs.append(index)
        figures = ScenarioFigures(8, 0, 1.0, 64, 20.0, 8.0, {"ttft_p95_ms": 50.0, "e2e_p95_ms": 500.0}, "m")
        return Round(role, index, (), 1.0, figures, None, None, host=host), None

    return run


BUSY = HostLoad(10.0, 2, 0.0, 0.4, 0.5)


class TestRemeasure:
    def test_a_pair_with_a_disturbed_round_is_measured_again_whole_and_in_its_order(self):
        order = []
        run = run_pairs(
            _arm(Role.BASELINE, [QUIET, QUIET], order),
            _arm(Role.CANDIDATE, [QUIET, BUSY], order),  # the candidate round of pair 2
            RoundPolicy(min_pairs=3, max_pairs=3),
            Thresholds(),
        )
        # pair 2 is C B: measured, then measured again as C B
        assert "".join(order) == "bc" + "cb" + "cb" + "bc"
        assert len(run.baseline) == len(run.candidate) == 3
        assert [r.index for r in run.candidate] == [0, 1, 2]  # the new rounds take the old places
        (replaced,) = run.replaced
        assert replaced.pair == 1 and replaced.reasons == ("candidate round 2: host_disturbed",)
        assert replaced.candidate.host is BUSY and run.candidate[1].host is QUIET
        assert replaced.to_json()["candidate"]["flags"] == ["host_disturbed"]

    def test_a_pair_is_measured_again_once_at_most(self):
        order = []
        run = run_pairs(
            _arm(Role.BASELINE, [BUSY, BUSY], order),
            _arm(Role.CANDIDATE, [], order),
            RoundPolicy(min_pairs=2, max_pairs=2),
            Thresholds(),
        )
        assert "".join(order) == "bc" + "bc" + "cb"
        assert [p.pair for p in run.replaced] == [0]
        assert run.baseline[0].flags == ("host_disturbed",)  # kept, still flagged

    def test_not_past_the_budget_and_not_when_turned_off(self):
        ticks = iter(range(0, 1000, 10))
        run = run_pairs(
            _arm(Role.BASELINE, [BUSY], []),
            _arm(Role.CANDIDATE, [], []),
            RoundPolicy(min_pairs=2, max_pairs=2, budget_s=15.0),
            Thresholds(),
            clock=lambda: float(next(ticks)),
        )
        assert run.replaced == ()  # a pair took 10 s, one more would pass 15 s
        run = run_pairs(
            _arm(Role.BASELINE, [BUSY], []),
            _arm(Role.CANDIDATE, [], []),
            RoundPolicy(min_pairs=2, max_pairs=2, remeasure_disturbed=False),
            Thresholds(),
        )
        assert run.replaced == () and run.baseline[0].flags == ("host_disturbed",)

    def test_only_disturbances_count_not_the_servers_own_behaviour(self):
        queued = Round(Role.BASELINE, 0, (), 1.0, None, None, None, queue_wait_s=0.5)
        assert queued.flags == ("queued_requests",)
        quiet = Round(Role.CANDIDATE, 0, (), 1.0, None, None, None)
        assert disturbance_reasons(queued, quiet) == ()


class _Handle:
    def __init__(self, pid, log_path):
        self.pid, self.log_path, self.base_url = pid, log_path, "http://127.0.0.1:1"

    def pids(self):
        return [self.pid]


def _spin():
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_the_host_sampler_tells_the_servers_load_from_another_processs(tmp_path: Path):
    from pytest_specsel.backends.host import ProcessHostSampler

    log = tmp_path / "server.log"
    log.write_text("Compiling a graph for compile range (1, 2) takes 3.00 s\n")  # before the window
    server, other = _spin(), _spin()
    try:
        sampler = ProcessHostSampler()
        sampler.start(_Handle(server.pid, log))
        with log.open("a") as f:
            f.write("Engine 000: Running: 4 reqs, Waiting: 2 reqs, Preemptions: 1\n")
        time.sleep(1.5)
        load = sampler.stop()
    finally:
        for proc in (server, other):
            proc.kill()
            proc.wait()
    assert load is not None and load.cpus >= 1
    # two spinning processes on this host: one the server's, one somebody else's
    assert load.ours_share >= 0.2 and load.other_share >= 0.2, load
    assert "host_disturbed" in load.flags()
    assert len(load.log_events) == 1 and load.log_events[0].startswith("preemption:")


class TestSplitCores:
    def test_the_baseline_computes_on_the_first_half_and_every_other_server_on_the_rest(self):
        from pytest_specsel.run.servers import split_cores

        assert split_cores(Role.BASELINE, [0, 1]) == (0,)
        assert split_cores(Role.CANDIDATE, [1, 0]) == (1,)
        assert split_cores(Role.CANDIDATE, [0, 1, 2, 3]) == (2, 3)
        assert split_cores(Role.BASELINE, [3]) == ()  # one core: the backend's own choice

    def test_the_launcher_binds_vllms_openmp_threads_to_them(self, tmp_path, monkeypatch):
        import dataclasses

        from pytest_specsel.backends.vllm.launcher import serve_env
        from pytest_specsel.core.protocol import LaunchSpec
        from pytest_specsel.core.records import Device
        from pytest_specsel.study.file import load_study

        study = load_study(None, tmp_path)
        spec = LaunchSpec("g0", "/m", "s", study.backend, None, tmp_path / "g0.log", Device.CPU)
        monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
        assert "VLLM_CPU_OMP_THREADS_BIND" not in serve_env(spec)  # vLLM's own choice
        assert serve_env(dataclasses.replace(spec, cpu_cores=(1,)))["VLLM_CPU_OMP_THREADS_BIND"] == "1"

    def test_the_study_key_is_audited(self, tmp_path):
        from pytest_specsel.study.file import StudyError
        from pytest_specsel.study.file import load_study

        path = tmp_path / "specsel.toml"
        path.write_text('[specsel.backend]\ncpu_bind = "halves"\n')
        with pytest.raises(StudyError, match=r'specsel.toml:2: specsel.backend.cpu_bind: .*"split"'):
            load_study(path, tmp_path)
        path.write_text('[specsel.backend]\ncpu_bind = "split"\n[specsel.run]\nremeasure_disturbed = false\n')
        study = load_study(path, tmp_path)
        assert study.backend.cpu_bind == "split" and study.policy.remeasure_disturbed is False
