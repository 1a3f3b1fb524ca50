"""The toy proposers' recipes on a tiny random Llama (seconds): what they write is what
vLLM 0.32 loads (names, shapes, config keys), and the cache is reused while the recipe holds.
The real training on the bundled target runs in the set-up script and the e2e test."""

import dataclasses
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from pytest_specsel.core.workloads import load_workload  # noqa: E402
from pytest_specsel.embedded import eagle3  # noqa: E402
from pytest_specsel.embedded import selftext  # noqa: E402
from pytest_specsel.embedded import toy_proposers  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VOCAB = 300


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """30 layers like the bundled target (vLLM's default aux layers depend on the count)."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=30,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    out = tmp_path_factory.mktemp("models") / "models--org--tiny" / "snapshots" / "abc"
    model.save_pretrained(out)
    return out


def _text(rows=12, length=24):
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, VOCAB, (rows, length), generator=gen)
    answer = torch.zeros(rows, length, dtype=torch.bool)
    answer[:, 8:] = True
    return selftext.SelfText(tokens, answer, torch.ones(rows, length, dtype=torch.bool), 0, 0.0)


def test_training_prompts_are_distinct_and_never_a_measured_or_warmup_prompt():
    prompts = selftext.training_prompts(96)
    assert len(set(prompts)) == 96
    assert prompts == selftext.training_prompts(96)  # seeded
    shipped = set()
    for path in (REPO / "benchmarks" / "workloads").glob("*.jsonl"):
        shipped |= {p.prompt for p in load_workload(path.stem, path).prompts}
    assert not shipped & set(prompts)


def test_the_eagle3_head_has_vllms_names_shapes_and_vocabulary_map(tiny_target, tmp_path):
    rec = dataclasses.replace(eagle3.recipe(), steps=2, batch=2, held_out=2)
    facts = eagle3.train(tiny_target, _text(), rec, tmp_path / "head")
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27] == facts["aux_layer_ids"]
    assert config["target_model"] == "org/tiny"
    tensors = safetensors_torch.load_file(str(tmp_path / "head" / "model.safetensors"))
    draft = config["draft_vocab_size"]
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (32, 64)  # reads [embedding, features]
    assert tensors["midlayer.self_attn.k_proj.weight"].shape == (16, 64)
    assert tensors["fc.weight"].shape == (32, 96)  # three target layers in
    assert tensors["lm_head.weight"].shape == (draft, 32)
    assert "embed_tokens.weight" not in tensors  # vLLM shares the target's
    # vLLM: target id = draft id + d2t[draft id]; t2d marks the same ids
    target_ids = torch.arange(draft) + tensors["d2t"]
    assert torch.equal(torch.nonzero(tensors["t2d"]).flatten(), target_ids)
    assert len(facts["held_out_agreement_by_step_after"]) == 3


def test_the_draft_model_is_the_targets_first_layers_with_its_vocabulary(tiny_target, tmp_path):
    rec = dataclasses.replace(toy_proposers.draft_recipe(), steps=2, batch=2, held_out=2, layers=3)
    facts = toy_proposers.train_draft(tiny_target, _text(), rec, tmp_path / "draft")
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert config["num_hidden_layers"] == 3 and config["vocab_size"] == VOCAB
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert 0.0 <= facts["held_out_agreement_after"] <= 1.0


def test_a_proposer_is_reused_while_its_recipe_and_target_hold(tmp_path):
    out = tmp_path / "p"
    out.mkdir()
    (out / "config.json").write_text("{}")
    key = toy_proposers.draft_recipe().key("snap")
    (out / "specsel_provenance.json").write_text(json.dumps({"recipe_key": key}))
    assert toy_proposers._cached(out, key) is not None
    assert toy_proposers._cached(out, toy_proposers.draft_recipe().key("other-snapshot")) is None
    assert (
        toy_proposers._cached(out, dataclasses.replace(toy_proposers.draft_recipe(), steps=7).key("snap"))
        is None
    )


def test_set_up_progress_says_how_far_and_how_long_is_left():
    from pytest_specsel.embedded.progress import Progress

    lines: list[str] = []
    now = [0.0]
    progress = Progress("training", 200, "steps", say=lines.append, clock=lambda: now[0])
    for _ in range(200):
        now[0] += 0.5
        progress.advance()
    assert len(lines) == 10  # each tenth, the last one the end
    assert lines[0] == "specsel: training: 20/200 steps, 10 s, about 90 s left"
    assert lines[-1] == "specsel: training: 200/200 steps, 100 s"
