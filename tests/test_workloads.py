"""Workloads beyond single prompts: chat requests, categories, per-workload counts, and
imports of public request sets into frozen JSONL with provenance (issue 24)."""

import hashlib
import json
from pathlib import Path

import pytest

from pytest_specsel.__main__ import main
from pytest_specsel.core.workloads import WorkloadError
from pytest_specsel.core.workloads import load_workload
from pytest_specsel.files.imports import ImportOptions
from pytest_specsel.files.imports import WorkloadImportError
from pytest_specsel.files.imports import import_workload
from pytest_specsel.study.file import study_from_mapping
from pytest_specsel.study.locator import StudyError

SPEC_BENCH = Path(__file__).parent / "data" / "workloads" / "spec_bench_sample.jsonl"


def write(tmp_path, *lines, name="w.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


CHAT = {
    "request_id": "c1",
    "category": "rag",
    "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And times 3?"},
    ],
}


class TestChatRequests:
    def test_a_chat_line_keeps_its_frozen_history_and_category(self, tmp_path):
        workload = load_workload("w", write(tmp_path, CHAT, {"request_id": "p1", "prompt": "hi"}))
        chat, single = workload.prompts
        assert chat.prompt == "And times 3?" and chat.category == "rag"
        assert chat.chat()[2] == {"role": "assistant", "content": "4."} and len(chat.chat()) == 4
        assert single.chat() == [{"role": "user", "content": "hi"}] and single.category is None
        assert chat.identity != single.identity

    @pytest.mark.parametrize(
        "line,message",
        [
            ({**CHAT, "messages": []}, "'messages' must be a non-empty list"),
            (
                {**CHAT, "messages": [{"role": "tool", "content": "x"}]},
                "messages\\[0\\]: unknown role 'tool'",
            ),
            ({**CHAT, "messages": CHAT["messages"][:3]}, "ends with a assistant turn"),
            (
                {
                    **CHAT,
                    "messages": [
                        {"role": "user", "content": "a"},
                        {"role": "system", "content": "b"},
                        {"role": "user", "content": "c"},
                    ],
                },
                "messages\\[1\\]: a system turn comes before",
            ),  # fmt: skip
            (
                {**CHAT, "messages": [{"role": "user", "content": " "}]},
                "'content' must be a non-empty string",
            ),
            ({**CHAT, "prompt": "both"}, "exactly one of 'prompt'"),
            ({"request_id": "x"}, "exactly one of 'prompt'"),
            ({**CHAT, "max_tokens": "64"}, "'max_tokens' must be a positive integer"),
            ({**CHAT, "category": ""}, "'category' must be a non-empty string"),
        ],
    )
    def test_every_bad_field_is_named_with_its_file_and_line(self, tmp_path, line, message):
        path = write(tmp_path, {"request_id": "ok", "prompt": "fine"}, line)
        with pytest.raises(WorkloadError, match=f"{path}:2: .*{message}"):
            load_workload("w", path)


class TestPerWorkloadCounts:
    def test_a_workload_may_set_its_own_request_count(self, tmp_path):
        write(tmp_path, *({"request_id": f"r{i}", "prompt": f"p{i}"} for i in range(30)), name="big.jsonl")
        study = study_from_mapping(
            {"workloads": {"general": "big.jsonl", "mixed": {"path": "big.jsonl", "num_prompts": 24}}},
            tmp_path,
        )
        assert study.prompts_of("general") == study.num_prompts == 8 and study.prompts_of("mixed") == 24
        assert study.workloads["mixed"] == tmp_path / "big.jsonl"

    @pytest.mark.parametrize(
        "entry,message",
        [
            ({"num_prompts": 3}, "a table needs path"),
            ({"path": "a.jsonl", "num_prompts": 0}, "workloads.mixed.num_prompts"),
        ],
    )
    def test_a_bad_workload_table_is_named(self, tmp_path, entry, message):
        with pytest.raises(StudyError, match=message):
            study_from_mapping({"workloads": {"mixed": entry}}, tmp_path)


class TestImports:
    def test_spec_bench_keeps_the_first_turn_and_the_category_and_writes_its_provenance(self, tmp_path):
        out = tmp_path / "mixed.jsonl"
        provenance = import_workload("spec-bench", SPEC_BENCH, out, ImportOptions(per_category=1, seed=3))
        workload = load_workload("mixed", out)
        assert {p.category for p in workload.prompts} == {
            "coding", "math_reasoning", "qa", "rag", "summarization", "translation", "writing",
        }  # fmt: skip
        writing = next(p for p in workload.prompts if p.category == "writing")
        assert (
            len(writing.messages) == 1 and writing.messages[0][0] == "user"
        )  # the second turn has no answer
        side = json.loads((tmp_path / "mixed.jsonl.provenance.json").read_text())
        assert side == provenance
        assert side["source_sha256"] == hashlib.sha256(SPEC_BENCH.read_bytes()).hexdigest()
        assert side["sha256"] == workload.sha256 and side["written"] == 7 and side["seed"] == 3
        assert side["by_category_eligible"]["qa"] == 2 and side["by_category"]["qa"] == 1
        assert out.read_text().splitlines()[0].startswith('{"request_id": "specbench-')  # no header line

    def test_the_same_seed_draws_the_same_slice_and_another_seed_may_not(self, tmp_path):
        a = import_workload("spec-bench", SPEC_BENCH, tmp_path / "a.jsonl", ImportOptions(sample=5, seed=1))
        b = import_workload("spec-bench", SPEC_BENCH, tmp_path / "b.jsonl", ImportOptions(sample=5, seed=1))
        assert a["sha256"] == b["sha256"] and a["written"] == 5
        others = {
            import_workload(
                "spec-bench", SPEC_BENCH, tmp_path / f"s{s}.jsonl", ImportOptions(sample=5, seed=s)
            )["sha256"]
            for s in range(2, 6)
        }
        assert others - {a["sha256"]}

    def test_sharegpt_freezes_the_history_up_to_the_last_human_turn(self, tmp_path):
        source = tmp_path / "sg.json"
        source.write_text(json.dumps([
            {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"},
                                          {"from": "human", "value": "how are you?"}, {"from": "gpt", "value": "fine"}]},
            {"id": "b", "conversations": [{"from": "gpt", "value": "only an answer"}]},
        ]))  # fmt: skip
        provenance = import_workload("sharegpt", source, tmp_path / "sg.jsonl", ImportOptions())
        (only,) = load_workload("sg", tmp_path / "sg.jsonl").prompts
        assert only.request_id == "sharegpt-a" and [r for r, _ in only.messages] == [
            "user",
            "assistant",
            "user",
        ]
        assert provenance["written"] == 1

    def test_vllm_custom_and_openai_chat(self, tmp_path):
        custom = write(tmp_path, {"prompt": "tell me", "output_tokens": 32}, name="custom.src")
        import_workload("vllm-custom", custom, tmp_path / "c.jsonl", ImportOptions())
        (prompt,) = load_workload("c", tmp_path / "c.jsonl").prompts
        assert prompt.prompt == "tell me" and prompt.max_tokens == 32
        log = write(tmp_path, {"id": "x", "messages": CHAT["messages"] + [{"role": "assistant", "content": "12."}],
                               "max_tokens": 16, "category": "math"}, name="log.src")  # fmt: skip
        import_workload("openai-chat", log, tmp_path / "o.jsonl", ImportOptions())
        (chat,) = load_workload("o", tmp_path / "o.jsonl").prompts
        assert (
            chat.messages[-1] == ("user", "And times 3?")
            and chat.max_tokens == 16
            and chat.category == "math"
        )

    @pytest.mark.parametrize(
        "fmt,content,message",
        [
            ("spec-bench", '{"question_id": 1}\n', ":1: spec-bench lines carry"),
            ("spec-bench", "not json\n", ":1: not valid JSON"),
            ("vllm-custom", '{"text": "x"}\n', ":1: vllm-custom lines carry a 'prompt'"),
            ("sharegpt", '{"id": 1}', "sharegpt is a JSON list"),
            ("openai-chat", '{"messages": [{"role": "tool", "content": "x"}]}\n', "unknown role 'tool'"),
            ("yaml", "", "unknown format 'yaml'"),
        ],
    )
    def test_a_bad_source_says_where(self, tmp_path, fmt, content, message):
        source = tmp_path / "src"
        source.write_text(content)
        with pytest.raises(WorkloadImportError, match=message):
            import_workload(fmt, source, tmp_path / "out.jsonl", ImportOptions())
        assert not (tmp_path / "out.jsonl").exists()

    def test_max_prompt_tokens_needs_the_targets_tokenizer(self, tmp_path):
        with pytest.raises(WorkloadImportError, match="give --tokenizer DIR"):
            import_workload(
                "spec-bench", SPEC_BENCH, tmp_path / "o.jsonl", ImportOptions(max_prompt_tokens=10)
            )

    def test_the_command_line_imports_and_exits_2_on_a_bad_source(self, tmp_path, capsys):
        out = tmp_path / "m.jsonl"
        assert (
            main(["workload", "import", "spec-bench", str(SPEC_BENCH), "--out", str(out), "--sample", "4"])
            == 0
        )
        assert "specsel workload: 4 requests to" in capsys.readouterr().out
        bad = tmp_path / "bad"
        bad.write_text("[]\n")
        assert main(["workload", "import", "spec-bench", str(bad), "--out", str(out)]) == 2
        assert "bad:1: each line must be a JSON object" in capsys.readouterr().err


def test_max_prompt_tokens_drops_by_the_targets_chat_template_and_says_how_many(tmp_path):
    """Counted with the bundled target's tokenizer and chat template (set up by scripts/setup-cpu.sh)."""
    root = Path(__file__).resolve().parents[1] / ".specsel" / "hub"
    folders = sorted(root.glob("models--specsel-bundled--SmolLM2-135M-Instruct*/snapshots/*"))
    if not folders:
        pytest.skip("the bundled target is not set up (bash scripts/setup-cpu.sh)")
    options = ImportOptions(max_prompt_tokens=120, tokenizer=str(folders[0]))
    provenance = import_workload("spec-bench", SPEC_BENCH, tmp_path / "short.jsonl", options)
    dropped = provenance["dropped"]["longer than 120 prompt tokens"]
    assert 0 < dropped < 12 and provenance["written"] == 12 - dropped
    assert "summarization" not in provenance["by_category"]  # whole articles: all longer


def _round(role, index, per_category, rate):
    """A round of requests: per category its count and decode rate (tokens/s) scale, 3
    tokens per chunk on a speculative side (rate above 1)."""
    from pytest_specsel.core.measurement import RequestRecord
    from pytest_specsel.core.measurement import Round

    requests = []
    for category, (count, scale) in per_category.items():
        for i in range(count):
            tokens, seconds = 65, 64 / (20.0 * scale * rate[index % len(rate)])
            chunks = 64 // 3 if scale > 1 else 64
            requests.append(
                RequestRecord(
                    f"{category}-{i}",
                    0,
                    "p",
                    "o",
                    0.0,
                    100.0,
                    (1.0,) * chunks,
                    100.0 + 1000 * seconds,
                    5,
                    tokens,
                )
            )
    return Round(role, index, tuple(requests), 1.0, None, None, None)


class TestPerCategory:
    def test_each_category_gets_its_decode_rate_ratio_with_an_interval_and_its_acceptance(self):
        from pytest_specsel.core.categories import by_category
        from pytest_specsel.core.records import Role

        categories = {f"{c}-{i}": c for c in ("code", "chat", "rare") for i in range(10)}
        noise = (1.0, 1.05, 0.95)
        base = [
            _round(Role.BASELINE, i, {"code": (4, 1.0), "chat": (4, 1.0), "rare": (1, 1.0)}, noise)
            for i in range(3)
        ]
        cand = [
            _round(Role.CANDIDATE, i, {"code": (4, 2.0), "chat": (4, 1.0), "rare": (1, 1.0)}, (1.0, 1.0, 1.0))
            for i in range(3)
        ]
        figures = {f.category: f for f in by_category(base, cand, categories, 0.95, proposal_length=4)}
        code, chat, rare = figures["code"], figures["chat"], figures["rare"]
        assert code.candidate_requests == 12 and code.decode_rate_ratio == pytest.approx(2.0, rel=0.05)
        assert code.decode_rate_ratio_interval.low < 2.0 < code.decode_rate_ratio_interval.high
        assert code.accepted_per_step == pytest.approx(64 / 21 - 1)  # 64 tokens after the first in 21 chunks
        assert code.acceptance_rate == pytest.approx((64 / 21 - 1) / 4)
        assert code.baseline_accepted_per_step == pytest.approx(0.0)
        assert chat.decode_rate_ratio == pytest.approx(1.0, rel=0.05)
        assert rare.decode_rate_ratio is None and "needs 8 per side" in rare.note
        assert by_category(base, cand, {}, 0.95) == ()

    def test_a_selection_over_a_categorised_workload_hands_off_its_figures_per_category(self, tmp_path):
        from pytest_specsel.backends.fake import FakeScript
        from pytest_specsel.backends.fake import fake_bundle
        from pytest_specsel.core.records import Device
        from pytest_specsel.files.artifacts import claim_label
        from pytest_specsel.run.runner import Selection

        lines = [
            {"request_id": f"{c}{i}", "category": c, "prompt": f"{c} {i}"}
            for c in ("a", "b")
            for i in range(8)
        ]
        write(tmp_path, *lines, name="mixed.jsonl")
        table = {"target": {"model": "fake/target"}, "workloads": {"mixed": {"path": "mixed.jsonl", "num_prompts": 16}},
                 "run": {"concurrency": [1], "warmup": 0}}  # fmt: skip
        study = study_from_mapping(table, tmp_path)
        bundle, _ = fake_bundle({"g1_ngram": FakeScript(token_s=0.005)})
        sel = Selection(
            study, bundle, claim_label(tmp_path / "r", "cat", "test"), real=True, device=Device.CPU
        )
        sel.preflight()
        for name in ("g0_target_only", "g1_ngram"):
            sel.open(name)
            sel.measure(name, sel.scenarios[0])
            sel.close(name)
        sel.stop_all()
        handoff = json.loads(sel.finish()["handoff"].read_text())
        entry = handoff["candidates"]["g1_ngram"]
        figures = entry["scenarios"]["mixed-c1"]["by_category"]
        assert sorted(figures) == ["a", "b"] and figures["a"]["candidate_requests"] >= 8
        assert figures["a"]["decode_rate_ratio_interval"]["low"] > 1.0  # the fake candidate decodes faster
        from pytest_specsel.glue.reporting import format_categories

        lines = format_categories([sel.view("g1_ngram", sel.scenarios[0])])
        assert lines[1].startswith("per category (explains the decision, does not make it")
        assert lines[2].split()[:4] == ["candidate", "scenario", "category", "requests"]
        row = next(line for line in lines if line.startswith("g1_ngram") and " a " in line)
        assert "mixed-c1" in row and "24/24" in row  # 8 requests x 3 rounds a side
        assert ".2f" not in row  # the figures printed, not their format (a defect of the first run)
        from pytest_specsel.files.report import write_report

        page = write_report(sel.paths.root).read_text()
        assert 'id="categories"' in page and "<td>24/24</td>" in page


class TestRecordedArrivals:
    """A traffic log's own arrival times, kept by the import and replayed as recorded."""

    def _log(self, tmp_path, stamps):
        lines = [
            {"id": f"q{i}", "messages": [{"role": "user", "content": f"question {i}"}], "timestamp": t}
            for i, t in enumerate(stamps)
        ]
        return write(tmp_path, *lines, name="log.src")

    def test_the_import_keeps_the_logs_times_in_order_from_the_first_written_request(self, tmp_path):
        # ISO 8601 and epoch seconds alike; the log is not in time order
        log = self._log(tmp_path, ["2026-12-07T10:00:02.500Z", "2026-12-07T10:00:01Z", 1796637605.0])
        provenance = import_workload("openai-chat", log, tmp_path / "o.jsonl", ImportOptions())
        workload = load_workload("o", tmp_path / "o.jsonl")
        assert [p.request_id for p in workload.prompts] == ["q1", "q0", "q2"]
        assert workload.recorded_arrivals() == pytest.approx((0.0, 1.5, 1796637605.0 - 1796637601.0))
        assert provenance["arrivals"] == "recorded"
        assert workload.recorded_rate() == pytest.approx(2 / 4.0)

    def test_a_sample_keeps_each_requests_recorded_time(self, tmp_path):
        log = self._log(tmp_path, [float(t) for t in range(10)])
        import_workload("openai-chat", log, tmp_path / "o.jsonl", ImportOptions(sample=3, seed=1))
        arrivals = load_workload("o", tmp_path / "o.jsonl").recorded_arrivals()
        assert len(arrivals) == 3 and arrivals[0] == 0.0 and all(a == int(a) for a in arrivals)
        assert list(arrivals) == sorted(arrivals)

    def test_a_log_without_times_writes_none_and_a_bad_time_says_where(self, tmp_path):
        plain = write(tmp_path, {"messages": [{"role": "user", "content": "hi"}]}, name="plain.src")
        provenance = import_workload("openai-chat", plain, tmp_path / "p.jsonl", ImportOptions())
        assert provenance["arrivals"] is None
        assert load_workload("p", tmp_path / "p.jsonl").recorded_arrivals() is None
        bad = self._log(tmp_path, ["yesterday"])
        with pytest.raises(WorkloadImportError, match=r"log.src:1: timestamp 'yesterday' is neither"):
            import_workload("openai-chat", bad, tmp_path / "b.jsonl", ImportOptions())

    @pytest.mark.parametrize(
        "lines,message",
        [
            ([{"arrival_s": -1}], r":1: 'arrival_s' must be a number of seconds >= 0"),
            ([{"arrival_s": "1"}], r":1: 'arrival_s' must be a number"),
            ([{"arrival_s": 0.0}, {}], r":2: no 'arrival_s' where other lines have one"),
            ([{"arrival_s": 2.0}, {"arrival_s": 1.0}], r":2: arrival_s 1 is before line 1's 2"),
        ],
    )
    def test_a_bad_recorded_arrival_is_named_with_its_file_and_line(self, tmp_path, lines, message):
        path = write(tmp_path, *({"request_id": f"r{i}", "prompt": "p", **x} for i, x in enumerate(lines)))
        with pytest.raises(WorkloadError, match=f"{path}{message}"):
            load_workload("w", path)

    def test_recorded_is_one_more_open_loop_level_and_a_bad_rate_entry_is_named(self, tmp_path):
        from pytest_specsel.core.results import scenarios_of

        study = study_from_mapping(
            {
                "workloads": {"log": "log.jsonl"},
                "run": {"concurrency": [2], "request_rate": [1.0, "recorded"]},
            },
            tmp_path,
        )
        assert study.recorded_arrivals and study.request_rate == (1.0,)
        keys = [s.key for s in scenarios_of(study)]
        assert keys == ["log-c2", "log-r1", "log-recorded"]
        assert study.peak_concurrency == 2
        with pytest.raises(StudyError, match=r'run.request_rate.*and "recorded"'):
            study_from_mapping({"run": {"request_rate": ["as logged"]}}, tmp_path)


def test_a_recorded_replay_sends_each_repeat_after_the_last_at_the_logs_times(tmp_path):
    import dataclasses

    from pytest_specsel.core.results import Scenario
    from pytest_specsel.run.replay import replay_spec

    path = write(
        tmp_path, *({"request_id": f"r{i}", "prompt": "p", "arrival_s": t} for i, t in enumerate([5, 6, 9]))
    )
    workload = load_workload("log", path)
    study = dataclasses.replace(study_from_mapping({"workloads": {"log": str(path)}}, tmp_path), repeats=2)

    class Handle:
        base_url = "http://x"

    spec = replay_spec(study, workload, Handle(), Scenario("log", 4, recorded=True))
    # 2 gaps over 4 s: 0.5 a second; the second pass starts one mean gap (2 s) after the last
    assert spec.arrivals == (0.0, 1.0, 4.0, 6.0, 7.0, 10.0) and spec.request_rate == 0.5
    plain = load_workload("w", write(tmp_path, {"request_id": "a", "prompt": "p"}, name="p.jsonl"))
    with pytest.raises(WorkloadError, match="records no arrival_s"):
        replay_spec(study, plain, Handle(), Scenario("w", 4, recorded=True))


class TestFirstAnswers:
    """Spec-Bench's second turns with a first answer written once by the target."""

    def _server(self, seen, status=200, content="The answer is 42."):
        import httpx

        def handle(request):
            if request.url.path == "/v1/models":
                return httpx.Response(
                    200, json={"data": [{"id": "target", "root": "/hub/target/snapshots/abc"}]}
                )
            if request.url.path == "/version":
                return httpx.Response(200, json={"version": "0.32.0"})
            seen.append(json.loads(request.content))
            return httpx.Response(status, json={"choices": [{"message": {"content": content}}]})

        return httpx.MockTransport(handle)

    def _lines(self):
        return [
            {"request_id": "specbench-81", "messages": [{"role": "user", "content": "Write a poem."}],
             "_second_turn": "Now shorter."},
            {"request_id": "specbench-161", "messages": [{"role": "user", "content": "Translate this."}]},
        ]  # fmt: skip

    def test_a_two_turn_question_gets_the_targets_first_answer_frozen_before_its_second_turn(self):
        from pytest_specsel.files.first_answers import FirstAnswers
        from pytest_specsel.files.first_answers import answer_first_turns

        seen = []
        lines, provenance = answer_first_turns(
            self._lines(), FirstAnswers("http://t", 64), self._server(seen)
        )
        two, one = lines
        assert two["request_id"] == "specbench-81-t2" and [m["role"] for m in two["messages"]] == [
            "user",
            "assistant",
            "user",
        ]
        assert (
            two["messages"][1]["content"] == "The answer is 42."
            and two["messages"][2]["content"] == "Now shorter."
        )
        assert one == self._lines()[1]  # a one-turn question is sent as it is, and not asked
        (asked,) = seen
        assert (asked["temperature"], asked["max_tokens"], asked["model"]) == (0.0, 64, "target")
        assert asked["messages"] == [{"role": "user", "content": "Write a poem."}]
        assert provenance["root"] == "/hub/target/snapshots/abc" and provenance["version"] == "0.32.0"
        assert provenance["answered"] == 1 and provenance["temperature"] == 0.0

    def test_an_unanswered_question_or_an_unknown_model_says_which(self):
        from pytest_specsel.files.first_answers import FirstAnswers
        from pytest_specsel.files.first_answers import answer_first_turns

        with pytest.raises(ValueError, match="answered 500 for specbench-81"):
            answer_first_turns(self._lines(), FirstAnswers("http://t"), self._server([], status=500))
        with pytest.raises(ValueError, match="wrote an empty first answer for specbench-81"):
            answer_first_turns(self._lines(), FirstAnswers("http://t"), self._server([], content=" "))
        with pytest.raises(ValueError, match="model 'other' is not served at http://t .it serves: target."):
            answer_first_turns(self._lines(), FirstAnswers("http://t", model="other"), self._server([]))

    def test_the_import_writes_the_answered_requests_and_says_who_answered(self, tmp_path, monkeypatch):
        import pytest_specsel.files.imports as imports
        from pytest_specsel.files.first_answers import FirstAnswers
        from pytest_specsel.files.first_answers import answer_first_turns

        transport = self._server([])
        monkeypatch.setattr(
            imports, "answer_first_turns", lambda lines, ask: answer_first_turns(lines, ask, transport)
        )
        options = ImportOptions(categories=("writing", "translation"), first_answers=FirstAnswers("http://t"))
        provenance = import_workload("spec-bench", SPEC_BENCH, tmp_path / "a.jsonl", options)
        prompts = {p.request_id: p for p in load_workload("a", tmp_path / "a.jsonl").prompts}
        assert sorted(prompts) == ["specbench-161", "specbench-162", "specbench-81-t2"]
        assert [r for r, _ in prompts["specbench-81-t2"].messages] == ["user", "assistant", "user"]
        assert (
            provenance["first_answers"]["answered"] == 1
            and provenance["options"]["first_answers"]["url"] == "http://t"
        )
        plain = import_workload(
            "spec-bench", SPEC_BENCH, tmp_path / "b.jsonl", ImportOptions(categories=("writing",))
        )
        assert plain["first_answers"] is None
        assert [p.request_id for p in load_workload("b", tmp_path / "b.jsonl").prompts] == ["specbench-81"]

    def test_the_command_line_refuses_answers_for_a_format_without_second_turns(self, tmp_path, capsys):
        out = tmp_path / "x.jsonl"
        argv = [
            "workload",
            "import",
            "vllm-custom",
            str(SPEC_BENCH),
            "--out",
            str(out),
            "--answer-first-turns",
            "http://t",
        ]
        assert main(argv) == 2
        assert "--answer-first-turns is for spec-bench" in capsys.readouterr().err
