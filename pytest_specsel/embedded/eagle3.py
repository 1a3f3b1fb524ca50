"""A one-layer EAGLE-3 head for the bundled target, trained on CPU from its own hidden states.

The head is built to load as vLLM's ``Eagle3LlamaForCausalLM`` (``llama_eagle3.py`` in
vLLM 0.32) and computes what that class computes, so that what it learns here is what
vLLM runs:

- the target's residual stream after layers 2, 15 and 27 (vLLM's auxiliary ids 2, 15, 27,
  HF ``hidden_states[k]``), concatenated, go through ``fc`` (3H -> H) once;
- the decoder layer's attention reads ``[input_layernorm(embed(token)), hidden_norm(h)]``
  (2H wide) with ``h`` as the residual; ``norm`` of the layer's output gives the logits
  over a reduced draft vocabulary (``d2t``: target id = draft id + d2t[draft id]); the
  output before ``norm`` is the next draft step's ``h``;
- slot ``i`` pairs the target's features at position ``i`` with token ``i + 1`` and
  predicts token ``i + 2``; draft step ``s`` sits at position ``i + s - 1`` and attends to
  the first step's slots ``0..i`` and to its own earlier steps of slot ``i``.

Training unrolls the three draft steps (EAGLE-3's "training-time test") with the true
tokens as inputs; the token embeddings are the target's (not shipped, so vLLM shares them).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from pytest_specsel.embedded import selftext
from pytest_specsel.embedded.progress import Progress
from pytest_specsel.embedded.recipe import Recipe

__all__ = ["aux_layers", "recipe", "train"]


def aux_layers(num_layers: int) -> tuple[int, int, int]:
    """vLLM 0.32's default auxiliary layers (``interfaces.py``): (2, L // 2, L - 3); for the
    30-layer bundled target (2, 15, 27). Written into the head's config all the same."""
    return (2, num_layers // 2, num_layers - 3)


_STEPS = 3
_STEP_WEIGHTS = (1.0, 0.7, 0.5)


def recipe() -> Recipe:
    return Recipe("eagle3", steps=200, batch=8, lr=1e-3, layers=1)


def _draft_vocab(text: selftext.SelfText, vocab: int, size: int) -> Any:
    """The ``size`` target ids the head can propose: those the target used most in the
    training text, then the lowest remaining ids; sorted ascending."""
    import torch

    counts = torch.bincount(text.tokens[text.real], minlength=vocab)
    order = torch.argsort(counts, descending=True, stable=True)
    used = order[counts[order] > 0][:size]
    rest = torch.tensor([i for i in range(vocab) if counts[i] == 0][: size - len(used)], dtype=torch.long)
    return torch.sort(torch.cat([used, rest])).values


class _Head:
    """The head's tensors and forward, in vLLM's names (``midlayer.*``, ``fc``, ``norm``)."""

    def __init__(
        self, config: dict[str, Any], target_state: dict[str, Any], draft_ids: Any, seed: int
    ) -> None:
        import torch

        gen = torch.Generator().manual_seed(seed)
        h, inter = config["hidden_size"], config["intermediate_size"]
        heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
        last = f"model.layers.{config['target_layers'] - 1}."

        def from_target(name: str, extra_in: bool = False) -> Any:
            weight = target_state[last + name].clone()
            if extra_in:  # the embedding half starts small, the feature half as the target's
                weight = torch.cat([torch.randn(weight.shape, generator=gen) * 0.01, weight], dim=1)
            return weight

        eye = torch.zeros(h, h * 3)
        eye[:, -h:] = torch.eye(h)  # fc starts as "the deepest auxiliary layer"
        self.p: dict[str, Any] = {
            "midlayer.self_attn.q_proj.weight": from_target("self_attn.q_proj.weight", True),
            "midlayer.self_attn.k_proj.weight": from_target("self_attn.k_proj.weight", True),
            "midlayer.self_attn.v_proj.weight": from_target("self_attn.v_proj.weight", True),
            "midlayer.self_attn.o_proj.weight": from_target("self_attn.o_proj.weight"),
            "midlayer.mlp.gate_proj.weight": from_target("mlp.gate_proj.weight"),
            "midlayer.mlp.up_proj.weight": from_target("mlp.up_proj.weight"),
            "midlayer.mlp.down_proj.weight": from_target("mlp.down_proj.weight"),
            "midlayer.input_layernorm.weight": torch.ones(h),
            "midlayer.hidden_norm.weight": torch.ones(h),
            "midlayer.post_attention_layernorm.weight": from_target("post_attention_layernorm.weight"),
            "norm.weight": target_state["model.norm.weight"].clone(),
            "fc.weight": eye,
            "lm_head.weight": target_state["model.embed_tokens.weight"][draft_ids].clone(),
        }
        for tensor in self.p.values():
            tensor.requires_grad_(True)
        self.embed = target_state["model.embed_tokens.weight"]
        self.shape = (heads, kv, hd, inter)
        self.eps, self.theta = config["rms_norm_eps"], config["rope_theta"]

    def _norm(self, x: Any, name: str) -> Any:
        import torch

        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.p[name]

    def _rope(self, x: Any, pos: Any) -> Any:
        import torch

        hd = x.shape[-1]
        inv = 1.0 / (self.theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = pos[..., None].float() * inv  # [B, T, hd/2]
        cos, sin = (
            torch.cat([ang.cos(), ang.cos()], -1)[:, None],
            torch.cat([ang.sin(), ang.sin()], -1)[:, None],
        )
        half = hd // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    def step(self, tokens: Any, hidden: Any, pos: Any, cache: list[tuple[Any, Any]]) -> tuple[Any, Any]:
        """One draft step over every slot; returns (normed output, pre-norm output) and
        appends this step's keys and values to ``cache``. Logits: :meth:`logits`."""
        import torch
        import torch.nn.functional as F

        heads, kv, hd, _ = self.shape
        b, t, _ = hidden.shape
        emb = self._norm(F.embedding(tokens, self.embed), "midlayer.input_layernorm.weight")
        residual = hidden
        x = torch.cat([emb, self._norm(hidden, "midlayer.hidden_norm.weight")], -1)
        q = (x @ self.p["midlayer.self_attn.q_proj.weight"].T).view(b, t, heads, hd).transpose(1, 2)
        k = (x @ self.p["midlayer.self_attn.k_proj.weight"].T).view(b, t, kv, hd).transpose(1, 2)
        v = (x @ self.p["midlayer.self_attn.v_proj.weight"].T).view(b, t, kv, hd).transpose(1, 2)
        q, k = self._rope(q, pos), self._rope(k, pos)
        cache.append((k, v))
        keys = torch.cat([c[0] for c in cache], 2).repeat_interleave(heads // kv, 1)
        values = torch.cat([c[1] for c in cache], 2).repeat_interleave(heads // kv, 1)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=_mask(t, len(cache)))
        attn = attn.transpose(1, 2).reshape(b, t, heads * hd) @ self.p["midlayer.self_attn.o_proj.weight"].T
        residual = attn + residual
        y = self._norm(residual, "midlayer.post_attention_layernorm.weight")
        y = (
            F.silu(y @ self.p["midlayer.mlp.gate_proj.weight"].T)
            * (y @ self.p["midlayer.mlp.up_proj.weight"].T)
        ) @ self.p["midlayer.mlp.down_proj.weight"].T
        prenorm = y + residual
        return self._norm(prenorm, "norm.weight"), prenorm

    def logits(self, normed: Any) -> Any:
        return normed @ self.p["lm_head.weight"].T


def _mask(t: int, steps: int) -> Any:
    """Step ``steps``'s queries see step 1's slots up to their own and their own earlier steps."""
    import torch

    causal = torch.ones(t, t, dtype=torch.bool).tril()
    diag = torch.eye(t, dtype=torch.bool)
    return torch.cat([causal] + [diag] * (steps - 1), dim=1)


def _aux_features(target: Path, text: selftext.SelfText, layers: tuple[int, ...]) -> Any:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()  # type: ignore[no-untyped-call]
    chunks = []
    with torch.no_grad():
        for i in range(0, text.tokens.shape[0], 16):
            out = model(
                input_ids=text.tokens[i : i + 16],
                attention_mask=text.real[i : i + 16].long(),
                output_hidden_states=True,
            )
            chunks.append(torch.cat([out.hidden_states[k] for k in layers], -1))
    return torch.cat(chunks), model.state_dict()


def _unrolled_loss(
    head: _Head, fc_in: Any, tokens: Any, answer: Any, to_draft: Any
) -> tuple[Any, list[float]]:
    """Loss over the three draft steps; also each step's agreement with the target."""
    import torch
    import torch.nn.functional as F

    b, t = tokens.shape
    hidden = fc_in @ head.p["fc.weight"].T
    pos = torch.arange(t).expand(b, t)
    cache: list[tuple[Any, Any]] = []
    total, agree = torch.zeros(()), []
    for s in range(_STEPS):
        # slot i holds token i+1+s and predicts token i+2+s
        inp = torch.roll(tokens, -(1 + s), 1)
        want = torch.roll(tokens, -(2 + s), 1)
        valid = torch.roll(answer, -(2 + s), 1)
        valid[:, t - 2 - s :] = False
        normed, hidden = head.step(inp, hidden, pos + s, cache)
        labels = to_draft[want]
        keep = valid & (labels >= 0)  # the vocabulary projection only where it is scored
        if keep.any():
            logits = head.logits(normed[keep])
            total = total + _STEP_WEIGHTS[s] * F.cross_entropy(logits, labels[keep])
            hits = int((logits.argmax(-1) == labels[keep]).sum())
        else:
            hits = 0
        agree.append(hits / max(1, int(valid.sum())))
    return total, agree


def train(target: Path, text: selftext.SelfText, rec: Recipe, out: Path) -> dict[str, Any]:
    import torch

    torch.manual_seed(rec.seed)
    config = json.loads((target / "config.json").read_text())
    vocab = config["vocab_size"]
    draft_ids = _draft_vocab(text, vocab, min(8192, vocab))
    to_draft = torch.full((vocab,), -1, dtype=torch.long)
    to_draft[draft_ids] = torch.arange(len(draft_ids))
    feats, state = _aux_features(target, text, aux_layers(config["num_hidden_layers"]))
    rope = config.get("rope_parameters", {}).get("rope_theta", config.get("rope_theta", 10000.0))
    spec = {**config, "target_layers": config["num_hidden_layers"], "rope_theta": rope}
    spec.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    head = _Head(spec, state, draft_ids, rec.seed)
    held = slice(0, rec.held_out)
    rows = torch.arange(rec.held_out, text.tokens.shape[0])

    def measure() -> list[float]:
        with torch.no_grad():
            return _unrolled_loss(head, feats[held], text.tokens[held], text.answer[held], to_draft)[1]

    before = measure()
    optim = torch.optim.AdamW(list(head.p.values()), lr=rec.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda i: min(1.0, (i + 1) / 20) * 0.5 * (1 + math.cos(math.pi * i / rec.steps))
    )
    gen = torch.Generator().manual_seed(rec.seed)
    start, losses = time.monotonic(), []
    progress = Progress("training the toy EAGLE-3 head", rec.steps, "steps")
    for _ in range(rec.steps):
        pick = rows[torch.randint(0, len(rows), (rec.batch,), generator=gen)]
        loss, _ = _unrolled_loss(head, feats[pick], text.tokens[pick], text.answer[pick], to_draft)
        optim.zero_grad()
        loss.backward()
        optim.step()
        sched.step()
        losses.append(loss.item())
        progress.advance()
    seconds = time.monotonic() - start
    after = measure()
    _save(out, target, config, head, draft_ids, vocab)
    return {
        "train_seconds": round(seconds, 1),
        "loss_first_last": [round(losses[0], 3), round(losses[-1], 3)],
        "draft_vocab_size": len(draft_ids),
        "aux_layer_ids": list(aux_layers(config["num_hidden_layers"])),
        "held_out_agreement_by_step_before": [round(a, 3) for a in before],
        "held_out_agreement_by_step_after": [round(a, 3) for a in after],
    }


def _repo_id(target: Path) -> str:
    """``org/name`` of a folder in a Hugging Face cache layout, else the folder's path."""
    for parent in target.parents:
        if parent.name.startswith("models--"):
            return parent.name.removeprefix("models--").replace("--", "/")
    return str(target)


def _save(out: Path, target: Path, config: dict[str, Any], head: _Head, draft_ids: Any, vocab: int) -> None:
    import safetensors.torch
    import torch

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in head.p.items()}
    tensors["d2t"] = (draft_ids - torch.arange(len(draft_ids))).to(torch.long)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_ids] = True
    tensors["t2d"] = t2d
    safetensors.torch.save_file(tensors, str(out / "model.safetensors"))
    keep = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "vocab_size",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "hidden_act",
        "max_position_embeddings",
        "rope_parameters",
        "rope_theta",
        "attention_bias",
        "mlp_bias",
    )
    head_config = {k: config[k] for k in keep if k in config}
    head_config.update(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        num_hidden_layers=1,
        draft_vocab_size=len(draft_ids),
        eagle_aux_hidden_state_layer_ids=list(aux_layers(config["num_hidden_layers"])),
        tie_word_embeddings=False,
        torch_dtype="float32",
        target_model=_repo_id(target),
    )
    (out / "config.json").write_text(json.dumps(head_config, indent=2, sort_keys=True) + "\n")
    selftext.copy_tokenizer(target, out)
