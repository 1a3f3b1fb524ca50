"""The study file: defaults, merging, and the preflight audit's messages."""

import json
import textwrap
from pathlib import Path

import pytest

import pytest_specsel
from pytest_specsel.core.results import scenarios_of
from pytest_specsel.core.study import GROUPS
from pytest_specsel.core.workloads import WorkloadError
from pytest_specsel.core.workloads import load_workload
from pytest_specsel.study.file import StudyError
from pytest_specsel.study.file import load_study

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path, text, name="specsel.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_defaults_are_the_chapters(tmp_path):
    study = load_study(None, tmp_path)
    assert study.target_model == "Qwen/Qwen2.5-1.5B-Instruct"
    assert (study.num_prompts, study.warmup, study.repeats, study.max_tokens) == (8, 2, 1, 64)
    assert study.temperature == 0.0 and study.num_speculative_tokens == 5
    assert [s.group for s in study.candidates] == list(GROUPS)
    assert study.candidate("g1_ngram").options == {"prompt_lookup_min": 3, "prompt_lookup_max": 5}
    assert study.candidate("g4_dflash").min_backend_version == "0.25.1"
    assert study.gates.min_throughput_speedup == 1.10


def test_the_repos_cpu_study_loads_and_its_workloads_validate():
    study = load_study(None, REPO)
    assert study.backend.dtype == "float32"
    for name, path in study.workloads.items():
        workload = load_workload(name, path, study.num_prompts)
        assert len(workload.prompts) == 8


@pytest.mark.parametrize(
    "config", [None, *sorted((REPO / "benchmarks" / "profiles").glob("*.toml"))], ids=str
)
def test_every_shipped_study_names_files_that_exist(config):
    study = load_study(config, REPO)
    for name, path in study.workloads.items():
        load_workload(name, path, study.num_prompts)
    warmup = load_workload("warmup", study.warmup_workload)
    measured = {p.prompt for n, path in study.workloads.items() for p in load_workload(n, path).prompts}
    assert not measured & {p.prompt for p in warmup.prompts}


def test_round_keys_become_the_round_policy(tmp_path):
    write(tmp_path, "[specsel.run]\nrounds = 2\nmax_rounds = 4\nconfidence = 0.9\nscenario_budget_s = 120\n")
    policy = load_study(None, tmp_path).policy
    assert (policy.min_pairs, policy.max_pairs, policy.level, policy.budget_s) == (2, 4, 0.9, 120.0)
    assert policy.looks == 2  # at rounds, and once more where the planner aims


def test_pyproject_tool_table_is_read(tmp_path):
    write(
        tmp_path,
        """
        [project]
        name = "x"
        [tool.specsel.run]
        max_tokens = 32
    """,
        "pyproject.toml",
    )
    assert load_study(None, tmp_path).max_tokens == 32


def test_model_folders_are_relative_to_the_study_file(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "models" / "eagle").mkdir(parents=True)
    path = write(
        tmp_path / "conf",
        '[specsel.target]\nmodel = "org/target"\n[specsel.strategies.g3_eagle]\nasset = "../models/eagle"\n',
    )
    study = load_study(path, tmp_path)
    assert study.target_model == "org/target"
    assert study.candidate("g3_eagle").asset == str((tmp_path / "models" / "eagle").resolve())


def test_a_study_outside_the_checkout_finds_the_default_workloads_in_the_package(tmp_path):
    """A study in its own folder that names no workload: the defaults are the package's
    files (they used to be looked up beside the study, where they never are)."""
    (tmp_path / "my-study").mkdir()
    path = write(tmp_path / "my-study", '[specsel.target]\nmodel = "org/target"\n[specsel.run]\nwarmup = 2\n')
    study = load_study(path, tmp_path / "elsewhere")
    package = Path(pytest_specsel.__file__).resolve().parent / "data" / "workloads"
    assert study.warmup_workload == package / "speculative_warmup.jsonl"
    assert dict(study.workloads) == {
        "general": package / "speculative_general.jsonl",
        "repetition": package / "speculative_repetition.jsonl",
    }
    assert len(load_workload("warmup", study.warmup_workload).prompts) > 0
    # what the study writes is its own: results beside it, a workload it names relative to it
    assert study.results_dir == tmp_path / "my-study" / "benchmarks" / "results"
    write(tmp_path / "my-study", '[specsel]\nwarmup_workload = "w.jsonl"\n')
    assert load_study(path, tmp_path).warmup_workload == tmp_path / "my-study" / "w.jsonl"


def test_a_default_model_id_is_not_taken_for_a_folder_beside_the_study(tmp_path):
    (tmp_path / "Qwen" / "Qwen2.5-1.5B-Instruct").mkdir(parents=True)
    assert load_study(None, tmp_path).target_model == "Qwen/Qwen2.5-1.5B-Instruct"


def test_a_workloads_table_replaces_the_default_set(tmp_path):
    write(tmp_path, '[specsel.workloads]\nrepetition = "rep.jsonl"\n')
    assert dict(load_study(None, tmp_path).workloads) == {"repetition": tmp_path / "rep.jsonl"}


def test_a_strategy_override_keeps_the_other_defaults(tmp_path):
    write(
        tmp_path,
        """
        [specsel.strategies.g3_eagle]
        asset = "/models/eagle3"
    """,
    )
    g3 = load_study(None, tmp_path).candidate("g3_eagle")
    assert (g3.asset, g3.method, g3.family) == ("/models/eagle3", "eagle3", "eagle")


def test_each_listed_proposal_length_is_a_candidate_of_its_own(tmp_path):
    write(
        tmp_path,
        """
        [specsel.strategies.g1_ngram]
        num_speculative_tokens = [3, 5]
        [specsel.candidates.x_suffix]
        family = "suffix"
        method = "suffix"
        num_speculative_tokens = [8]
    """,
    )
    study = load_study(None, tmp_path)
    names = [c.name for c in study.candidates]
    assert names[:3] == ["g0_target_only", "g1_ngram-k3", "g1_ngram-k5"]
    # A one-element list keeps the table's name, as a plain integer does.
    assert names[-1] == "x_suffix" and study.candidate("x_suffix").num_speculative_tokens == 8
    assert [c.num_speculative_tokens for c in study.variants("g1_ngram")] == [3, 5]
    assert study.candidate("g1_ngram-k5").options == {"prompt_lookup_min": 3, "prompt_lookup_max": 5}
    with pytest.raises(KeyError):
        study.candidate("g1_ngram")  # two candidates: the name must say which


@pytest.mark.parametrize(
    "body,line,needle",
    [
        ('[specsel]\nrun_label = "a b"\n', 2, "run_label: 'a b': a run label may only use letters"),
        ("[specsel.backend]\ngpu_memory_utilization = 1.0\n", 2, "must lie strictly between 0 and 1"),
        ("[specsel.run]\nwarmup = -1\n", 2, "run.warmup: -1 must be >= 0"),
        ("[specsel.run]\nconcurrency = [1, 0]\n", 2, "run.concurrency: 0 must be a positive integer"),
        ("[specsel.run]\nnum_prompts = 0\n", 2, "run.num_prompts: 0 must be a positive integer"),
        ("[specsel.run]\nrequest_rate = [1, 0]\n", 2, "run.request_rate: [1, 0] must be a list of positive"),
        ("[specsel.run]\nrequest_rate = [2, 2.0]\n", 2, "run.request_rate: [2.0, 2.0] lists a level twice"),
        ("[specsel.run]\nconcurrency = []\n", 2, "run.concurrency: [] needs at least one level here or in"),
        ("[specsel.run]\nburstiness = 0\n", 2, "run.burstiness: 0.0 must be > 0 (1: Poisson"),
        ("[specsel.run]\nrate_max_concurrency = -1\n", 2, "run.rate_max_concurrency: -1 must be >= 0"),
        ("[specsel.run]\ngoodput_tpot_ms = -5\n", 2, "run.goodput_tpot_ms: -5.0 must be >= 0 (0: no target)"),
        ("[specsel.run]\n\ntemperature = 0.7\n", 3, "exact-match parity only holds at temperature 0"),
        (
            "[specsel.strategies.g1_ngram]\noptions = {prompt_lookup_min = 5, prompt_lookup_max = 3}\n",
            2,
            "need 1 <= min <= max",
        ),
        ("[specsel.strategies.g9_medusa]\nenabled = true\n", 1, "the identities are fixed"),
        ("[specsel.run]\nmax_tokns = 3\n", 2, "unknown key 'max_tokns'; accepted keys: "),
        (
            '[specsel.strategies.g3_eagle]\nfamily = "dflash"\n',
            2,
            "is family 'dflash', but g3_eagle is the 'eagle' slot",
        ),
        ('[specsel.strategies.g2_mtp]\nfamily = "medusa"\n', 2, "unknown speculative family 'medusa'"),
        ("[specsel.run]\nrounds = 4\nmax_rounds = 3\n", 3, "run.max_rounds: 3 must be >= run.rounds (4)"),
        ("[specsel.run]\nconfidence = 1.0\n", 2, "run.confidence: 1.0 must lie in [0.5, 1)"),
        (
            "[specsel.backend]\nmax_num_seqs = -4\n",
            2,
            "backend.max_num_seqs: -4 must be >= 1, or 0 for vLLM's",
        ),
        ('[specsel.candidates.G7]\nfamily = "ngram"\n', 1, "must use a-z, 0-9 and '_'"),
        (
            "[specsel.strategies.g1_ngram]\nnum_speculative_tokens = [3, 3]\n",
            2,
            "strategies.g1_ngram.num_speculative_tokens: [3, 3] lists a proposal length twice",
        ),
        (
            "[specsel.strategies.g1_ngram]\nnum_speculative_tokens = [3, 0]\n",
            2,
            "must be a positive integer or a non-empty list of them",
        ),
        (
            '[specsel.strategies.g1_ngram]\nnum_speculative_tokens = "3"\n',
            2,
            "'3' must be of type int or list",
        ),
        (
            "[specsel.strategies.g0_target_only]\nnum_speculative_tokens = [2, 3]\n",
            2,
            "the target-only baseline proposes nothing",
        ),
    ],
)
def test_audit_errors_name_file_line_key_and_form(tmp_path, body, line, needle):
    path = write(tmp_path, body)
    with pytest.raises(StudyError) as info:
        load_study(None, tmp_path)
    message = str(info.value)
    assert message.startswith(f"specsel: {path}:{line}: specsel.")
    assert needle in message


def test_exact_match_can_be_waived_above_temperature_zero(tmp_path):
    write(tmp_path, "[specsel.run]\ntemperature = 0.7\nrequire_exact_match_at_t0 = false\n")
    assert load_study(None, tmp_path).temperature == 0.7


def test_a_missing_config_path_is_named(tmp_path):
    with pytest.raises(StudyError, match="--specsel-config .*nope.toml.*no such file"):
        load_study(tmp_path / "nope.toml", tmp_path)


def test_bad_toml_is_reported_with_the_file(tmp_path):
    path = write(tmp_path, "[specsel\n")
    with pytest.raises(StudyError, match=f"{path}: not valid TOML"):
        load_study(None, tmp_path)


class TestWorkloads:
    def lines(self, tmp_path, *rows):
        path = tmp_path / "w.jsonl"
        path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
        return path

    def test_duplicates_name_both_lines(self, tmp_path):
        path = self.lines(tmp_path, {"request_id": "a", "prompt": "x"}, {"request_id": "a", "prompt": "y"})
        with pytest.raises(WorkloadError, match=f"{path}:2: duplicate request_id 'a' \\(first at line 1\\)"):
            load_workload("w", path)

    def test_bad_json_names_the_line(self, tmp_path):
        path = self.lines(tmp_path, {"request_id": "a", "prompt": "x"}, "{oops")
        with pytest.raises(WorkloadError, match=f"{path}:2: not valid JSON"):
            load_workload("w", path)

    @pytest.mark.parametrize(
        "row,needle",
        [
            ({"request_id": "", "prompt": "x"}, "'request_id' must be a non-empty string"),
            ({"request_id": "a", "prompt": 3}, "'prompt' must be a non-empty string"),
            ({"request_id": "a", "prompt": "x", "max_tokens": 0}, "'max_tokens' must be a positive integer"),
            ({"request_id": "a", "prompt": "x", "temp": 1}, "unknown key(s) ['temp']"),
        ],
    )
    def test_fields_are_checked(self, tmp_path, row, needle):
        path = self.lines(tmp_path, row)
        with pytest.raises(WorkloadError) as info:
            load_workload("w", path)
        assert f"{path}:1:" in str(info.value) and needle in str(info.value)

    def test_prompts_are_never_cycled_to_reach_a_count(self, tmp_path):
        path = self.lines(tmp_path, {"request_id": "a", "prompt": "x"})
        with pytest.raises(
            WorkloadError, match="num_prompts = 3 but .* has only 1 prompts; prompts are never cycled"
        ):
            load_workload("w", path, 3)

    def test_the_checksum_identifies_the_frozen_file(self, tmp_path):
        path = self.lines(tmp_path, {"request_id": "a", "prompt": "x"})
        first = load_workload("w", path).sha256
        path.write_text(path.read_text().replace("x", "y"))
        assert load_workload("w", path).sha256 != first

    def test_shipped_workloads_have_distinct_ids_and_the_repetition_one_quotes_its_prompt(self):
        rep = load_workload(
            "repetition", REPO / "pytest_specsel/data/workloads/speculative_repetition.jsonl", 8
        )
        gen = load_workload("general", REPO / "pytest_specsel/data/workloads/speculative_general.jsonl", 8)
        ids = [p.request_id for p in rep.prompts + gen.prompts]
        assert len(ids) == len(set(ids)) == 16
        # Each repetition prompt carries a block (code, list, lines, JSON) the answer should copy.
        assert all("\n" in p.prompt or ":" in p.prompt for p in rep.prompts)


def test_request_rates_add_open_loop_scenarios_capped_at_the_largest_concurrency(tmp_path):
    (tmp_path / "specsel.toml").write_text(
        "[specsel.run]\nconcurrency = [1, 4]\nrequest_rate = [0.5, 2]\nburstiness = 0.5\n", encoding="utf-8"
    )
    study = load_study(None, tmp_path)
    assert study.request_rate == (0.5, 2.0) and study.burstiness == 0.5 and study.rate_cap == 4
    keys = [s.key for s in scenarios_of(study)]
    assert keys[:4] == ["general-c1", "general-c4", "repetition-c1", "repetition-c4"]
    assert keys[4:] == ["general-r0.5", "general-r2", "repetition-r0.5", "repetition-r2"]
    assert {s.concurrency for s in scenarios_of(study) if s.request_rate} == {4}
    (tmp_path / "specsel.toml").write_text(
        "[specsel.run]\nconcurrency = []\nrequest_rate = [1]\nrate_max_concurrency = 16\n", encoding="utf-8"
    )
    study = load_study(None, tmp_path)
    assert [s.key for s in scenarios_of(study)] == ["general-r1", "repetition-r1"]
    assert study.peak_concurrency == 16
