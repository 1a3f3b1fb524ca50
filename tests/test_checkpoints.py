"""Static checkpoint identity, on the real published config.json files in
tests/data/checkpoints (SOURCES.md there names each file's source). No config here is
made up: where a test needs a variant, it loads a real file and changes one key, and
says so."""

import dataclasses
import json
import struct
from pathlib import Path

import pytest

from pytest_specsel.backends import models
from pytest_specsel.core import checkpoints
from pytest_specsel.core.checkpoints import CheckpointKind as Kind
from pytest_specsel.core.families import family_contract

DATA = Path(__file__).parent / "data" / "checkpoints"
#: names of an EAGLE-3 head's tensors, as vLLM's Eagle3LlamaForCausalLM.load_weights takes them
EAGLE3_TENSORS = (
    "midlayer.self_attn.q_proj.weight",
    "midlayer.hidden_norm.weight",
    "fc.weight",
    "norm.weight",
)


def real(name):
    return json.loads((DATA / name).read_text())


def identity(name, tensor_names=None):
    return checkpoints.classify(real(name), tensor_names)


PROPOSERS = {
    "eagle1_vicuna_7b_head.json": Kind.EAGLE1_HEAD,
    "eagle1_llama3.1_8b_yuhuili.json": Kind.EAGLE1_HEAD,
    "eagle3_llama3_8b_safeailab_train.json": Kind.EAGLE3_HEAD,
    "eagle3_llama3_8b_specforge.json": Kind.EAGLE3_HEAD,
    "eagle3_qwen3_8b_specforge.json": Kind.EAGLE3_HEAD,
    "speculators_eagle3_qwen3moe_issue1065.json": Kind.EAGLE3_HEAD,
    "dflash_qwen3_8b_b16.json": Kind.DFLASH,
    "dflash_qwen3_4b.json": Kind.DFLASH,
    "dflash_qwen2.5_0.5b.json": Kind.DFLASH,
    "dflash_qwen3.6_27b.json": Kind.DFLASH,
    "dspark_qwen3_8b_specforge.json": Kind.DSPARK,
    "dspark_gemma4_12b_block7.json": Kind.DSPARK,
}
MTP_TARGETS = {
    "mtp_deepseek_v3.json": "num_nextn_predict_layers 1",
    "mtp_glm5.json": "num_nextn_predict_layers 1",
    "mtp_mimo_7b_base.json": "num_nextn_predict_layers 1",
    "mtp_qwen3.5_27b.json": "text_config.mtp_num_hidden_layers 1",
}
TARGETS = ("target_llama3.1_8b.json", "target_qwen3_8b.json", "target_qwen2.5_1.5b.json")


class TestClassify:
    @pytest.mark.parametrize("name, kind", sorted(PROPOSERS.items()))
    def test_each_published_proposer_config_classifies_to_its_kind(self, name, kind):
        found = identity(name)
        assert found.kind is kind, found.evidence
        assert found.family == {"eagle1_head": "eagle", "eagle3_head": "eagle"}.get(kind, kind.value)

    @pytest.mark.parametrize("name, evidence", sorted(MTP_TARGETS.items()))
    def test_targets_with_native_mtp_layers_classify_as_mtp_targets(self, name, evidence):
        found = identity(name)
        assert (found.kind, found.family, found.evidence) == (Kind.MTP_TARGET, "mtp", evidence)

    @pytest.mark.parametrize("name", TARGETS)
    def test_plain_targets_classify_as_causal_lms_without_a_feature_width(self, name):
        found = identity(name)
        assert (found.kind, found.family, found.feature_width) == (Kind.CAUSAL_LM, "draft_model", None)

    def test_the_safeailab_eagle3_config_is_told_by_draft_vocab_size_not_by_architecture(self):
        found = identity("eagle3_llama3_8b_safeailab_train.json")
        assert found.evidence == "architectures ['LlamaForCausalLM'] with draft_vocab_size 32000"
        assert (found.vocab_size, found.draft_vocab_size) == (128256, 32000)

    def test_a_one_layer_llama_is_an_eagle1_head_by_shape_only_while_tensor_names_are_unknown(self):
        by_shape = identity("eagle1_vicuna_7b_head.json")
        assert by_shape.kind is Kind.EAGLE1_HEAD and "one-layer head by shape" in by_shape.evidence
        # The same real config with tensor names: those of EAGLE-1's reference head (fc +
        # layers.0.*), those of a one-layer causal LM (model.layers.0.*), an EAGLE-3 layer.
        head = identity("eagle1_vicuna_7b_head.json", {"fc.weight", "layers.0.self_attn.q_proj.weight"})
        assert head.kind is Kind.EAGLE1_HEAD and "fc.weight" in head.evidence
        plain = identity(
            "eagle1_vicuna_7b_head.json", {"model.layers.0.mlp.up_proj.weight", "lm_head.weight"}
        )
        assert plain.kind is Kind.CAUSAL_LM
        assert identity("eagle1_vicuna_7b_head.json", EAGLE3_TENSORS).kind is Kind.EAGLE3_HEAD

    def test_the_specforge_dspark_architecture_wins_over_its_nested_dflash_config(self):
        found = identity("dspark_qwen3_8b_specforge.json")
        assert found.evidence == "architectures ['DSparkDraftModel']"
        assert (found.mask_token_id, found.block_size, found.num_target_layers) == (151669, 7, 36)

    @pytest.mark.parametrize(
        "name, own, aux, source",
        [
            (
                "dflash_qwen3_8b_b16.json",
                (1, 9, 17, 25, 33),
                (2, 10, 18, 26, 34),
                "dflash_config.target_layer_ids + 1",
            ),
            (
                "dspark_qwen3_8b_specforge.json",
                (1, 9, 17, 25, 33),
                (2, 10, 18, 26, 34),
                "dflash_config.target_layer_ids + 1",
            ),
            (
                "dspark_gemma4_12b_block7.json",
                (5, 17, 29, 41, 46),
                (6, 18, 30, 42, 47),
                "target_layer_ids + 1",
            ),
            (
                "speculators_eagle3_qwen3moe_issue1065.json",
                (2, 46, 91, 93),
                (2, 46, 91, 93),
                "eagle_aux_hidden_state_layer_ids",
            ),
        ],
    )
    def test_declared_layer_ids_become_vllm_aux_ids(self, name, own, aux, source):
        found = identity(name)
        assert (found.target_layer_ids, found.aux_layer_ids, found.layer_ids_from) == (own, aux, source)

    def test_a_speculators_config_yields_its_declared_verifier_and_its_inner_geometry(self):
        found = identity("speculators_eagle3_qwen3moe_issue1065.json")
        assert found.speculators and found.evidence == "speculators_model_type 'eagle3'"
        assert found.declared_target == "/model/from_s3"
        # target_hidden_size is null there: the width is transformer_layer_config.hidden_size
        assert (found.feature_width, found.vocab_size, found.draft_vocab_size) == (4096, 151936, 32000)

    def test_a_config_without_architectures_or_drafter_keys_is_unknown(self):
        config = real("target_qwen3_8b.json")
        del config["architectures"]  # mutation of the real file: its architectures removed
        found = checkpoints.classify(config)
        assert (found.kind, found.family) == (Kind.UNKNOWN, None)

    def test_the_identity_writes_every_field_as_json(self):
        data = identity("dflash_qwen3_8b_b16.json").to_json()
        assert set(data) == {f.name for f in dataclasses.fields(checkpoints.CheckpointIdentity)}
        assert data["kind"] == "dflash" and data["aux_layer_ids"] == [2, 10, 18, 26, 34]
        json.dumps(data)


class TestChecks:
    @pytest.mark.parametrize(
        "name, slot, own",
        [
            ("dflash_qwen3_8b_b16.json", "eagle", "dflash"),
            ("dspark_qwen3_8b_specforge.json", "dflash", "dspark"),
            ("eagle3_llama3_8b_specforge.json", "dspark", "eagle"),
            ("target_llama3.1_8b.json", "eagle", "draft_model"),
            ("eagle1_llama3.1_8b_yuhuili.json", "draft_model", "eagle"),
            ("mtp_deepseek_v3.json", "draft_model", "mtp"),
        ],
    )
    def test_a_checkpoint_of_another_family_is_a_kind_problem_naming_both_families(self, name, slot, own):
        problem = checkpoints.check_kind(slot, identity(name))
        assert problem is not None and problem.startswith("kind: proposer is ")
        assert f"family {own!r}, not family {slot!r}" in problem

    def test_the_dflash_drafter_in_the_eagle_slot_says_what_it_is(self):
        assert checkpoints.check_kind("eagle", identity("dflash_qwen3_8b_b16.json")) == (
            "kind: proposer is a DFlash drafter (architectures ['DFlashDraftModel']), "
            "family 'dflash', not family 'eagle'"
        )

    def test_the_eagle_slot_takes_both_eagle_generations_and_draft_model_a_plain_model(self):
        for name in ("eagle1_vicuna_7b_head.json", "eagle3_qwen3_8b_specforge.json"):
            assert checkpoints.check_kind("eagle", identity(name)) is None
        assert checkpoints.check_kind("draft_model", identity("target_qwen2.5_1.5b.json")) is None

    def test_an_unknown_kind_is_a_problem_too(self):
        config = real("target_qwen3_8b.json")
        del config["architectures"]  # mutation of the real file: its architectures removed
        problem = checkpoints.check_kind("draft_model", checkpoints.classify(config))
        assert problem.startswith("kind: proposer is of no known checkpoint kind")

    def test_the_qwen3_4b_dflash_drafter_is_too_narrow_for_the_qwen3_8b_target(self):
        problem = checkpoints.check_feature_width(
            identity("dflash_qwen3_4b.json"), real("target_qwen3_8b.json")
        )
        assert problem == (
            "hidden_size: target 4096 != proposer feature width 2560 "
            "(a DFlash drafter reads the target's hidden states)"
        )

    def test_the_qwen2_5_0_5b_dflash_drafter_is_too_narrow_for_the_qwen2_5_1_5b_target(self):
        problem = checkpoints.check_feature_width(
            identity("dflash_qwen2.5_0.5b.json"), real("target_qwen2.5_1.5b.json")
        )
        assert problem.startswith("hidden_size: target 1536 != proposer feature width 896")

    def test_the_qwen3_8b_dflash_drafter_reads_layers_the_qwen3_8b_target_has(self):
        drafter = identity("dflash_qwen3_8b_b16.json")
        assert checkpoints.check_layers(drafter, real("target_qwen3_8b.json")) is None
        assert checkpoints.check_feature_width(drafter, real("target_qwen3_8b.json")) is None

    def test_the_qwen3_8b_dflash_drafter_reads_a_layer_qwen2_5_1_5b_does_not_have(self):
        problem = checkpoints.check_layers(
            identity("dflash_qwen3_8b_b16.json"), real("target_qwen2.5_1.5b.json")
        )
        assert problem == (
            "layers: proposer reads aux layers [34] (dflash_config.target_layer_ids + 1 of "
            "[1, 9, 17, 25, 33]) but the target has 28 layers (aux ids 0..28); "
            "proposer declares num_target_layers 36, the target has 28"
        )

    def test_the_qwen2_5_0_5b_drafter_ids_fit_qwen2_5_1_5b_but_its_declared_layer_count_does_not(self):
        problem = checkpoints.check_layers(
            identity("dflash_qwen2.5_0.5b.json"), real("target_qwen2.5_1.5b.json")
        )
        assert problem == "layers: proposer declares num_target_layers 24, the target has 28"

    def test_the_speculators_head_reads_layers_beyond_a_36_layer_target(self):
        problem = checkpoints.check_layers(
            identity("speculators_eagle3_qwen3moe_issue1065.json"), real("target_qwen3_8b.json")
        )
        assert problem.startswith("layers: proposer reads aux layers [46, 91, 93]")

    def test_the_qwen3_6_dflash_drafter_fits_qwen3_5_27b_through_its_text_config(self):
        drafter, target = identity("dflash_qwen3.6_27b.json"), real("mtp_qwen3.5_27b.json")
        for check in (
            checkpoints.check_vocab,
            checkpoints.check_feature_width,
            checkpoints.check_layers,
            checkpoints.check_mask_token,
        ):
            assert check(drafter, target) is None, check.__name__

    def test_a_mask_token_outside_the_target_vocab_is_a_problem(self):
        drafter = identity("dflash_qwen3_8b_b16.json")
        assert checkpoints.check_mask_token(drafter, real("target_qwen3_8b.json")) is None
        assert checkpoints.check_mask_token(drafter, real("target_llama3.1_8b.json")) == (
            "mask_token_id: proposer's mask token 151669 is outside the target vocab (vocab_size 128256)"
        )
        gemma = identity("dspark_gemma4_12b_block7.json")
        assert gemma.mask_token_id == 4 and gemma.block_size == 7

    def test_a_reduced_draft_vocab_needs_d2t_when_the_tensor_names_are_known(self):
        head, target = identity("eagle3_llama3_8b_specforge.json"), real("target_llama3.1_8b.json")
        assert checkpoints.check_draft_vocab(head, target, None) is None  # names unknown
        assert checkpoints.check_draft_vocab(head, target, {*EAGLE3_TENSORS, "d2t", "t2d"}) is None
        problem = checkpoints.check_draft_vocab(head, target, EAGLE3_TENSORS)
        assert problem.startswith("draft_vocab_size: proposer 32000 < target vocab_size 128256")
        assert "no d2t tensor" in problem

    def test_a_draft_vocab_larger_than_the_target_vocab_is_a_problem(self):
        config = real("eagle3_qwen3_8b_specforge.json")
        config["draft_vocab_size"] = 200000  # mutation of the real file: one key changed
        problem = checkpoints.check_draft_vocab(
            checkpoints.classify(config), real("target_qwen3_8b.json"), None
        )
        assert problem == "draft_vocab_size: proposer 200000 > target vocab_size 151936"

    def test_an_eagle3_head_compares_its_full_vocab_not_its_draft_vocab(self):
        head = identity("eagle3_qwen3_8b_specforge.json")
        assert checkpoints.check_vocab(head, real("target_qwen3_8b.json")) is None
        assert checkpoints.check_vocab(head, real("target_llama3.1_8b.json")) == (
            "vocab_size: target 128256 != proposer 151936"
        )


def folder(tmp_path, name, config_file, tensors=None):
    """A checkpoint folder holding a real config.json (and, if given, a header-only
    safetensors file with these tensor names)."""
    path = tmp_path / name
    path.mkdir(parents=True)
    (path / "config.json").write_text((DATA / config_file).read_text())
    if tensors is not None:
        header = json.dumps({n: {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]} for n in tensors})
        (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0\0")
    return path


def pair(tmp_path, proposer_file, target_file, family, tensors=None):
    target = folder(tmp_path, "target", target_file)
    proposer = folder(tmp_path, "proposer", proposer_file, tensors)
    contract = family_contract(family)
    return models.check_pair(target, "org/target", proposer, contract.pair_checks, family=contract.family)


class TestCheckPair:
    @pytest.mark.parametrize(
        "proposer, target, family",
        [
            ("eagle3_llama3_8b_specforge.json", "target_llama3.1_8b.json", "eagle"),
            ("eagle1_llama3.1_8b_yuhuili.json", "target_llama3.1_8b.json", "eagle"),
            ("dflash_qwen3_8b_b16.json", "target_qwen3_8b.json", "dflash"),
            ("dspark_qwen3_8b_specforge.json", "target_qwen3_8b.json", "dspark"),
            ("dflash_qwen3.6_27b.json", "mtp_qwen3.5_27b.json", "dflash"),
            ("target_qwen2.5_1.5b.json", "target_qwen3_8b.json", "draft_model"),
        ],
    )
    def test_a_matching_real_pair_is_compatible(self, tmp_path, proposer, target, family):
        ok, why = pair(tmp_path, proposer, target, family)
        assert ok, why
        assert why.startswith("kind, vocab")

    def test_a_dflash_drafter_in_the_eagle_slot_is_incompatible_naming_both_families(self, tmp_path):
        ok, why = pair(tmp_path, "dflash_qwen3_8b_b16.json", "target_qwen3_8b.json", "eagle3")
        assert not ok and "family 'dflash', not family 'eagle'" in why

    def test_a_target_with_mtp_layers_is_no_draft_model(self, tmp_path):
        ok, why = pair(tmp_path, "mtp_mimo_7b_base.json", "target_qwen3_8b.json", "draft")
        assert not ok and "a target with native MTP layers" in why
        assert "family 'mtp', not family 'draft_model'" in why

    def test_a_drafter_for_a_smaller_target_fails_on_the_feature_width(self, tmp_path):
        ok, why = pair(tmp_path, "dflash_qwen3_4b.json", "target_qwen3_8b.json", "dflash")
        assert (ok, why.split(" (")[0]) == (False, "hidden_size: target 4096 != proposer feature width 2560")

    def test_a_speculators_head_for_a_deeper_target_fails_on_the_layers(self, tmp_path):
        ok, why = pair(
            tmp_path, "speculators_eagle3_qwen3moe_issue1065.json", "target_qwen3_8b.json", "eagle"
        )
        assert not ok and why.startswith("layers: proposer reads aux layers [46, 91, 93]")

    def test_the_tensor_names_from_safetensors_headers_decide_the_draft_vocab_check(self, tmp_path):
        ok, why = pair(
            tmp_path / "a",
            "eagle3_llama3_8b_specforge.json",
            "target_llama3.1_8b.json",
            "eagle",
            EAGLE3_TENSORS,
        )
        assert not ok and why.startswith("draft_vocab_size: proposer 32000 < target vocab_size 128256")
        tensors = (*EAGLE3_TENSORS, "d2t")
        ok, why = pair(
            tmp_path / "b", "eagle3_llama3_8b_specforge.json", "target_llama3.1_8b.json", "eagle", tensors
        )
        assert ok, why

    def test_tensor_names_are_unknown_without_safetensors_files(self, tmp_path):
        assert (
            models.safetensors_tensor_names(folder(tmp_path, "bin_only", "eagle1_vicuna_7b_head.json"))
            is None
        )
        named = folder(tmp_path, "named", "eagle1_vicuna_7b_head.json", ("fc.weight",))
        assert models.safetensors_tensor_names(named) == frozenset({"fc.weight"})
        assert (
            models.identify(named)
            .describe()
            .startswith("eagle1_head: architectures ['LlamaForCausalLM'] with tensor")
        )

    def test_the_kind_check_needs_the_slot_family(self, tmp_path):
        target = folder(tmp_path, "target", "target_qwen3_8b.json")
        proposer = folder(tmp_path, "proposer", "dflash_qwen3_8b_b16.json")
        with pytest.raises(ValueError, match="needs the slot's family"):
            models.check_pair(target, "org/target", proposer, family_contract("dflash").pair_checks)


def test_the_bundled_target_is_no_eagle3_head_as_cpu_paired_demo_once_claimed():
    """benchmarks/profiles/cpu_paired_demo.toml used to point G3 at the 30-layer target
    itself; vLLM then failed to load it. The static check now says what it is."""
    from pytest_specsel.core.families import family_contract
    from pytest_specsel.embedded.bundled import GGUF_SHA256
    from pytest_specsel.embedded.bundled import default_cache_dir
    from pytest_specsel.embedded.bundled import snapshot_dir

    target = snapshot_dir(Path(__file__).resolve().parents[1] / ".specsel" / "hub", GGUF_SHA256[:40])
    if not (target / "config.json").is_file():
        target = snapshot_dir(default_cache_dir(), GGUF_SHA256[:40])
    if not (target / "config.json").is_file():
        pytest.skip("the bundled target is not prepared (bash scripts/setup-cpu.sh)")
    ok, why = models.check_pair(
        target,
        "specsel-bundled/SmolLM2-135M-Instruct-Q4_1",
        target,
        family_contract("eagle").pair_checks,
        family="eagle",
    )
    assert not ok
    assert "causal" in why and "'eagle'" in why
