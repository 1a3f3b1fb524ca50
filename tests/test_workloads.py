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
        assert side["by_category_in_source"]["qa"] == 2 and side["by_category"]["qa"] == 1
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
