"""Deployed endpoints (``--specsel-remote``): the pure rules, the study table, and whole runs
against fake servers in threads (``tests/fake_endpoint.py``) that speak as vLLM does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specsel.core.endpoints import Identity
from pytest_specsel.core.endpoints import IdentityField
from pytest_specsel.core.endpoints import ServerFacts
from pytest_specsel.core.endpoints import Status
from pytest_specsel.core.endpoints import endpoint_decision
from pytest_specsel.core.endpoints import equivalence
from pytest_specsel.core.endpoints import fingerprints_agree
from pytest_specsel.core.endpoints import identity_of
from pytest_specsel.core.measurement import TokenLogprob
from pytest_specsel.core.records import Decision
from pytest_specsel.core.records import Verdict
from pytest_specsel.core.traffic import ServerTraffic
from pytest_specsel.study.file import StudyError
from pytest_specsel.study.file import study_from_mapping
from tests.fake_endpoint import FakeEndpoint
from tests.fake_endpoint import Knobs
from tests.test_plugin import CANDIDATE_TEST

KEY = "sk-specsel-test-4f1d9a7c2b"


def _answer(shift: float = 0.0, first: str = "a") -> tuple[TokenLogprob, ...]:
    return (
        TokenLogprob(first, -0.1 + shift, ((first, -0.1 + shift), ("b", -0.2 + shift))),
        TokenLogprob("c", -0.5 + shift, (("c", -0.5 + shift),)),
    )


def _facts(fingerprint=None, positions=None, model="m", version="0.32.0") -> ServerFacts:
    return ServerFacts(
        "http://x", model, "/r", 2048, version, True, positions is not None, positions, None, {}, fingerprint
    )


class TestIdentity:
    def test_equal_fingerprints_within_epsilon_verify_the_target(self):
        same, how = fingerprints_agree([_answer()], [_answer(0.004)], 0.01)
        assert same is True and "within" in how

    def test_log_probabilities_apart_by_more_than_epsilon_contradict_it(self):
        assert fingerprints_agree([_answer()], [_answer(0.5)], 0.01)[0] is False

    def test_a_different_first_token_is_a_near_tie_only_within_epsilon(self):
        tie = fingerprints_agree([_answer()], [_answer(first="b")], 0.25)
        far = fingerprints_agree([_answer()], [_answer(first="b")], 0.05)
        assert tie[0] is True and "near tie" in tie[1]
        assert far[0] is False

    def test_no_fingerprint_leaves_the_target_declared(self):
        base = _facts(None)
        identity = identity_of(
            {"target": "t", "model": "m", "num_speculative_tokens": 3}, base, _facts(None, 3), 0.01
        )
        assert identity.field("target").status is Status.DECLARED
        assert identity.field("num_speculative_tokens").status is Status.VERIFIED
        assert identity.unverified == ("target",)

    def test_the_proposal_length_is_verified_by_the_per_position_counter(self):
        base = _facts([_answer()])
        wrong = identity_of(
            {"target": "t", "model": "m", "num_speculative_tokens": 5}, base, _facts([_answer()], 3), 0.01
        )
        field = wrong.field("num_speculative_tokens")
        assert field.status is Status.CONTRADICTED and "3 positions" in field.how


class TestEndpointDecision:
    ACCEPT = Decision(Verdict.ACCEPT, "quality_and_net_benefit_passed")

    def _identity(self, status=Status.VERIFIED, trusted=False, vllm=True) -> Identity:
        return Identity((IdentityField("target", "t", status, "how"),), trusted, vllm, True)

    def test_foreign_traffic_never_accepts(self):
        decision = endpoint_decision(self.ACCEPT, self._identity(), ["foreign_traffic"])
        assert (decision.verdict, decision.reason) == (Verdict.TUNE, "foreign_traffic_in_window")

    def test_a_declared_target_is_tune_naming_the_field_unless_trusted(self):
        declared = endpoint_decision(self.ACCEPT, self._identity(Status.DECLARED), [])
        trusted = endpoint_decision(self.ACCEPT, self._identity(Status.DECLARED, trusted=True), [])
        assert (declared.verdict, declared.reason) == (Verdict.TUNE, "identity_declared:target")
        assert trusted.verdict is Verdict.ACCEPT

    def test_a_server_that_is_not_vllm_is_never_accepted_as_speculative(self):
        decision = endpoint_decision(self.ACCEPT, self._identity(vllm=False), [])
        assert decision.verdict is Verdict.TUNE

    def test_a_quality_failure_in_a_shared_window_is_not_the_candidates_alone(self):
        reject = Decision(Verdict.REJECT, "quality_gate_failed")
        assert endpoint_decision(reject, self._identity(), ["foreign_traffic"]).verdict is Verdict.TUNE
        assert endpoint_decision(reject, self._identity(), []) == reject

    @pytest.mark.parametrize(
        ("low", "high", "verdict"),
        [
            (0.97, 1.04, "equivalent"),
            (0.90, 1.02, "undecided"),
            (0.80, 1.30, "undecided"),
            (1.08, 1.20, "not_equivalent"),
        ],
    )
    def test_replicas_are_equivalent_only_when_the_whole_interval_is_inside_the_margin(
        self, low, high, verdict
    ):
        assert equivalence(low, high, 0.05) == verdict

    def test_a_verified_clean_endpoint_keeps_its_accept(self):
        assert endpoint_decision(self.ACCEPT, self._identity(), ["prefix_cache_hits"]) == self.ACCEPT


class TestTraffic:
    def test_more_requests_than_sent_is_foreign_traffic_on_an_endpoint_only(self):
        remote = ServerTraffic(8, 80, 512, 11.0, 110.0, 700.0, remote=True)
        local = ServerTraffic(8, 80, 512, 11.0, 110.0, 700.0, remote=False)
        assert remote.excess() == {"requests": 3.0, "prompt_tokens": 30.0, "output_tokens": 188.0}
        assert "foreign_traffic" in remote.flags() and "foreign_traffic" not in local.flags()

    def test_counts_that_match_are_clean(self):
        assert ServerTraffic(8, 80, 512, 8.0, 80.0, 513.0, remote=True).flags() == ()


class TestStudyTable:
    def _study(self, endpoint: dict, tmp_path: Path):
        text = "[specsel.strategies.g1_ngram.endpoint]\n" + "".join(
            f"{k} = {json.dumps(v)}\n" for k, v in endpoint.items()
        )
        table = {"strategies": {"g1_ngram": {"endpoint": endpoint}}}
        return study_from_mapping(table, tmp_path, "specsel.toml", text)

    def test_an_endpoint_table_is_read_with_its_variable_names(self, tmp_path):
        study = self._study(
            {
                "url": "http://h:8000/",
                "api_key_env": "MY_KEY",
                "metrics_urls": ["http://a/metrics", "http://b/metrics"],
            },
            tmp_path,
        )
        endpoint = next(c for c in study.candidates if c.group == "g1_ngram").endpoint
        assert endpoint.url == "http://h:8000" and endpoint.api_key_env == "MY_KEY"
        assert endpoint.metrics == ("http://a/metrics", "http://b/metrics")
        assert endpoint.key == "specsel.strategies.g1_ngram.endpoint"

    def test_a_url_without_scheme_names_file_line_and_key(self, tmp_path):
        with pytest.raises(
            StudyError, match=r"specsel.toml:2: specsel.strategies.g1_ngram.endpoint.url: 'h:8000'"
        ):
            self._study({"url": "h:8000"}, tmp_path)

    def test_a_key_given_instead_of_its_variable_name_is_refused(self, tmp_path):
        with pytest.raises(StudyError, match="name\\* of an environment variable"):
            self._study({"url": "http://h", "api_key_env": "sk-1234 5678"}, tmp_path)


# -- whole runs against fake endpoints ---------------------------------------------------


#: the plumbing is under test here, not the gates: two pairs decide a 3x speedup with wide budgets
WIDE = "max_ttft_regression_ratio = 1000.0\nmax_e2e_p95_regression_ratio = 50.0\n"


def _study(
    base: str,
    cand: str,
    extra: str = "",
    gates: str = WIDE + "memory_gate = false",
    cand_extra: str = "",
    base_extra: str = "",
) -> str:
    disabled = "".join(
        f"[specsel.strategies.{g}]\nenabled = false\n"
        for g in ("g2_mtp", "g3_eagle", "g4_dflash", "g5_dspark")
    )
    return f"""
[specsel]
results_dir = "results"
[specsel.target]
model = "fake/target"
[specsel.workloads]
general = "general.jsonl"
[specsel.run]
concurrency = [1]
num_prompts = 3
warmup = 1
rounds = 3
max_rounds = 3
baseline_rounds = 1
max_tokens = 12
num_speculative_tokens = 3
{extra}
[specsel.gates]
{gates}
[specsel.strategies.g0_target_only.endpoint]
url = "{base}"
api_key_env = "SPECSEL_TEST_KEY"
{base_extra}
[specsel.strategies.g1_ngram.endpoint]
url = "{cand}"
api_key_env = "SPECSEL_TEST_KEY"
{cand_extra}
{disabled}"""


@pytest.fixture
def remote(pytester, monkeypatch):
    monkeypatch.setenv("SPECSEL_TEST_KEY", KEY)

    def run(study: str, *args: str):
        pytester.makefile(".toml", specsel=study)
        words = " ".join(f"word{i} alpha beta gamma" for i in range(3))
        rows = [json.dumps({"request_id": f"gen-{i}", "prompt": f"{words} item {i}"}) for i in range(3)]
        pytester.makefile(".jsonl", general="\n".join(rows))
        pytester.makepyfile(test_selection=CANDIDATE_TEST)
        return pytester.runpytest_subprocess("--specsel-remote", "-p", "no:cacheprovider", *args)

    return run


def _doc(pytester, label: str, name: str) -> dict:
    return json.loads((pytester.path / "results" / label / f"{name}.json").read_text())


def _scenario(handoff: dict, name: str = "g1_ngram") -> dict:
    return handoff["candidates"][name]["scenarios"]["general-c1"]


def _rounds(pytester, label: str) -> list[dict]:
    raw = json.loads((pytester.path / "results" / label / "raw" / "g1_ngram__general-c1.json").read_text())
    return raw["rounds"]


class TestRemoteRun:
    def test_two_endpoints_give_a_decision_the_key_never_written(self, remote, pytester):
        base, cand = Knobs(api_key=KEY, token_s=0.006), Knobs(api_key=KEY, k=3, token_s=0.001)
        with FakeEndpoint(base) as b, FakeEndpoint(cand) as c:
            result = remote(
                _study(b.url, c.url),
                "--specsel-label",
                "ok",
                "--json-report",
                "--json-report-file=report.json",
            )
        out = result.stdout.str() + result.stderr.str()
        assert result.ret == 0, out
        handoff, manifest = _doc(pytester, "ok", "handoff"), _doc(pytester, "ok", "manifest")
        scenario = _scenario(handoff)
        assert scenario["decision"]["verdict"] == "accept", scenario["decision"]
        g1 = next(g for g in manifest["groups"] if g["candidate"] == "g1_ngram")
        assert g1["residence"] == "endpoints" and g1["endpoint"]["url"] == c.url
        identity = handoff["candidates"]["g1_ngram"]["endpoint"]["identity"]["fields"]
        assert identity["target"]["status"] == "verified"
        assert identity["num_speculative_tokens"]["status"] == "verified"
        assert handoff["gates"]["memory_gate"] is False
        assert all(a == f"Bearer {KEY}" for a in b.seen_auth + c.seen_auth)
        assert "nothing started" in out or "starting nothing" in out
        written = [p for p in pytester.path.rglob("*") if p.is_file()]
        assert any(p.name == "report.json" for p in written)
        leaked = [str(p) for p in written if KEY in p.read_text(errors="replace")]
        assert leaked == [] and KEY not in out

    def test_an_aa_pair_of_replicas_is_judged_against_the_equivalence_margin(self, remote, pytester):
        replica = '[specsel.candidates.aa_replica]\nfamily = "baseline"\n[specsel.candidates.aa_replica.endpoint]\nurl = "{u}"\napi_key_env = "SPECSEL_TEST_KEY"\n'
        with (
            FakeEndpoint(Knobs(api_key=KEY)) as b,
            FakeEndpoint(Knobs(api_key=KEY, k=3)) as c,
            FakeEndpoint(Knobs(api_key=KEY)) as a,
        ):
            remote(_study(b.url, c.url) + replica.format(u=a.url), "--specsel-label", "aa")
        aa = _doc(pytester, "aa", "handoff")["candidates"]["aa_replica"]
        found = aa["hardware_equivalent"]["general-c1"]
        assert found["margin"] == 0.05 and found["verdict"] == equivalence(*found["interval"], 0.05)
        assert aa["scenarios"]["general-c1"]["decision"]["verdict"] != "accept"

    def test_an_unreachable_endpoint_is_a_usage_error_naming_url_and_key(self, remote):
        with FakeEndpoint(Knobs(api_key=KEY)) as b:
            result = remote(_study(b.url, "http://127.0.0.1:9"))
        err = result.stderr.str()
        assert result.ret == 4
        assert (
            "http://127.0.0.1:9/v1/models is unreachable" in err
            and "specsel.strategies.g1_ngram.endpoint.url" in err
        )
        assert "specsel.toml:" in err
        assert "round 1" not in result.stdout.str()

    def test_a_wrong_model_name_says_what_the_server_serves(self, remote):
        with FakeEndpoint(Knobs(api_key=KEY)) as b, FakeEndpoint(Knobs(api_key=KEY, k=3, model="other")) as c:
            result = remote(_study(b.url, c.url))
        assert result.ret == 4
        assert "serves ['other'], not 'fake/target'" in result.stderr.str()

    def test_a_baseline_that_speculates_is_refused(self, remote):
        with FakeEndpoint(Knobs(api_key=KEY, k=3)) as b, FakeEndpoint(Knobs(api_key=KEY, k=3)) as c:
            result = remote(_study(b.url, c.url))
        assert result.ret == 4 and "cannot be the target-only baseline" in result.stderr.str()

    def test_a_disabled_baseline_is_a_usage_error_not_a_crash(self, remote):
        """Every endpoint is paired with G0's: without it there is nothing to measure against."""
        with FakeEndpoint(Knobs(api_key=KEY)) as b, FakeEndpoint(Knobs(api_key=KEY, k=3)) as c:
            result = remote(_study(b.url, c.url) + "[specsel.strategies.g0_target_only]\nenabled = false\n")
        err = result.stderr.str()
        assert result.ret == 4 and "KeyError" not in err + result.stdout.str()
        assert "g0_target_only" in err and "must be enabled" in err and "specsel.toml" in err

    def test_an_endpoint_without_metrics_is_incomplete_and_says_so(self, remote, pytester):
        with (
            FakeEndpoint(Knobs(api_key=KEY)) as b,
            FakeEndpoint(Knobs(api_key=KEY, metrics=False, version=None)) as c,
        ):
            remote(_study(b.url, c.url), "--specsel-label", "nometrics")
        scenario = _scenario(_doc(pytester, "nometrics", "handoff"))
        assert scenario["evidence"]["status"] == "incomplete"
        assert "speculative_execution_path" in scenario["evidence"]["missing_evidence"]
        assert scenario["decision"]["verdict"] == "tune"
        assert scenario["telemetry"]["source"] == "scrape_failed"

    def test_throttled_requests_are_retried_counted_and_flagged(self, remote, pytester):
        with FakeEndpoint(Knobs(api_key=KEY)) as b, FakeEndpoint(Knobs(api_key=KEY, k=3, throttle=4)) as c:
            remote(_study(b.url, c.url), "--specsel-label", "throttled")
        rounds = _rounds(pytester, "throttled")
        retried = sum(r["traffic"]["retries"] for r in rounds if r["traffic"])
        assert retried >= 1 and any("retried_requests" in r["flags"] for r in rounds)
        assert all(r["error"] is None for r in rounds)

    def test_a_gateways_replicas_are_summed_and_foreign_traffic_flagged(self, remote, pytester):
        pages = '\nmetrics_urls = ["{u}/metrics/0", "{u}/metrics/1"]'
        with (
            FakeEndpoint(Knobs(api_key=KEY)) as b,
            FakeEndpoint(Knobs(api_key=KEY, k=3, replicas=2, token_s=0.001)) as c,
        ):
            remote(_study(b.url, c.url, cand_extra=pages.format(u=c.url)), "--specsel-label", "gateway")
        measured = [r["traffic"] for r in _rounds(pytester, "gateway")]
        assert measured and all(t["server"]["requests"] == t["sent"]["requests"] for t in measured)
        assert all(t["excess"] == {} for t in measured)
        with (
            FakeEndpoint(Knobs(api_key=KEY)) as b,
            FakeEndpoint(Knobs(api_key=KEY, k=3, phantom_requests=1, token_s=0.001)) as c,
        ):
            remote(_study(b.url, c.url), "--specsel-label", "foreign")
        scenario = _scenario(_doc(pytester, "foreign", "handoff"))
        assert "foreign_traffic" in scenario["flags"] and scenario["counters_contaminated"] is True
        assert scenario["decision"]["verdict"] != "accept"
        excess = [r["traffic"]["excess"] for r in _rounds(pytester, "foreign")]
        assert all(e.get("requests") == 3 for e in excess)

    def test_memory_not_measured_keeps_the_gate_from_passing(self, remote, pytester):
        with (
            FakeEndpoint(Knobs(api_key=KEY, token_s=0.006)) as b,
            FakeEndpoint(Knobs(api_key=KEY, k=3, token_s=0.001)) as c,
        ):
            remote(_study(b.url, c.url, gates=WIDE), "--specsel-label", "memory")
        scenario = _scenario(_doc(pytester, "memory", "handoff"))
        assert scenario["memory"] is None or scenario["memory"]["measured"] == "not_measured_remote"
        assert "peak_memory_mb" in scenario["evidence"]["missing_evidence"]
        assert scenario["decision"]["verdict"] == "tune"

    def test_memory_is_read_from_the_gauge_the_study_names(self, remote, pytester):
        gauge = 'memory_metric = "DCGM_FI_DEV_FB_USED"'
        base = Knobs(api_key=KEY, token_s=0.006, fb_used_mib=(2000.0,))
        cand = Knobs(api_key=KEY, k=3, token_s=0.001, fb_used_mib=(3000.0, 2500.0))
        with FakeEndpoint(base) as b, FakeEndpoint(cand) as c:
            study = _study(b.url, c.url, gates=WIDE, cand_extra=gauge, base_extra=gauge)
            remote(study, "--specsel-label", "gauge")
        scenario = _scenario(_doc(pytester, "gauge", "handoff"))
        assert scenario["memory"]["measured"] == "prometheus:DCGM_FI_DEV_FB_USED"
        assert scenario["peak_memory_mb"] == 5500.0 and scenario["memory"]["samples"] >= 1
        assert "peak_memory_mb" not in scenario["evidence"]["missing_evidence"]

    def test_a_plan_lists_verified_and_declared_fields_and_sends_no_measured_traffic(self, remote):
        with (
            FakeEndpoint(Knobs(api_key=KEY)) as b,
            FakeEndpoint(Knobs(api_key=KEY, k=3, logprob_shift=0.5)) as c,
        ):
            result = remote(_study(b.url, c.url), "--specsel-plan")
            sent = c.chat_requests
        out = result.stdout.str()
        assert "target = " in out and "contradicted" in out
        assert "num_speculative_tokens = 3: verified" in out
        assert sent == 9  # the fingerprint's three prompts, taken three times; nothing measured

    def test_a_fingerprint_moved_once_by_a_batch_is_taken_again_and_verified(self, remote):
        moved = Knobs(api_key=KEY, k=3, logprob_shift=0.5, shift_requests=3)
        with FakeEndpoint(Knobs(api_key=KEY)) as b, FakeEndpoint(moved) as c:
            out = remote(_study(b.url, c.url), "--specsel-plan").stdout.str()
        assert "target = " in out and "contradicted" not in out
        assert "verified (" in out
