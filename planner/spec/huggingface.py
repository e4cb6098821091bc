"""Hugging Face `config.json` files as transformer specs.

`load_config(path)` reads a config.json (or a folder holding one) and `from_config(data, where)`
maps its dict, by its `architectures` entry, to the keys of `TransformerFile`; the spec is then
built and checked like a YAML one. Each architecture reads the keys of its HF configuration
class (defaults as that class has them); the README's table lists them. Missing required keys
are reported together; an unknown architecture is a one-line error listing the known ones.
The sequence length is `max_position_embeddings` (GPT-OSS: `initial_context_length`): train at
another with `--seq-len`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from planner.errors import SpecError
from planner.spec.base import short
from planner.spec.numbers import loads_json
from planner.spec.transformer import Transformer, build_transformer

MAX_CONFIG_BYTES = 1 << 20

# the keys every architecture reads (HF names), then each one's own
LLAMA_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
              "intermediate_size")


class _Config:
    """A config dict read key by key: required keys missing are collected, not raised one by
    one; optional keys take the HF class default."""

    def __init__(self, data: dict, where: str):
        self.data, self.where, self.missing = data, where, []

    def need(self, key: str) -> Any:
        if self.data.get(key) is None:
            self.missing.append(key)
            return 1
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def check(self) -> None:
        if self.missing:
            raise SpecError(f"{self.where}: missing keys {', '.join(map(repr, self.missing))} "
                            f"for {self.data['architectures'][0]}")


def _llama_like(c: _Config, *, tied: bool = False, qkv_bias: bool | None = None,
                default_seq: int = 2048) -> dict:
    """LlamaForCausalLM and its descendants: RMSNorm, rotary, SwiGLU, GQA."""
    heads = c.need("num_attention_heads")
    attention_bias = c.get("attention_bias", False)
    out = {
        "layers": c.need("num_hidden_layers"), "hidden": c.need("hidden_size"), "heads": heads,
        "kv_heads": c.get("num_key_value_heads", heads), "vocab": c.need("vocab_size"),
        "ffn_hidden": c.need("intermediate_size"), "ffn_kind": "swiglu",
        "seq_len": c.get("max_position_embeddings", default_seq),
        "tied_embeddings": c.get("tie_word_embeddings", tied), "bias": False,
        "qkv_bias": attention_bias if qkv_bias is None else qkv_bias,
        "out_bias": attention_bias, "mlp_bias": c.get("mlp_bias", False), "norm": "rmsnorm",
        "position_embedding": "rotary",
    }
    if c.get("head_dim") is not None:
        out["head_dim"] = c.get("head_dim")
    return out


def _sliding_all(c: _Config, out: dict, default: int | None = None) -> dict:
    """Mistral-style: every layer slides when `sliding_window` is set (absent: the class
    default; null: no window)."""
    window = c.data.get("sliding_window", default)
    if window is not None:
        out.update(sliding_window=window, sliding_window_pattern="S")
    return out


def _layer_types(c: _Config, default: str) -> str:
    """A sliding / full pattern from `layer_types` (sliding_attention / full_attention)."""
    types = c.get("layer_types")
    if not isinstance(types, list) or not types:
        return default
    marks = {"sliding_attention": "S", "full_attention": "F"}
    bad = [t for t in types if t not in marks]
    if bad:
        raise SpecError(f"{c.where}: key 'layer_types': unknown layer type {short(bad[0])} "
                        f"(known: {', '.join(marks)})")
    return "".join(marks[t] for t in types)


def llama(c: _Config) -> dict:
    return _llama_like(c)


def mistral(c: _Config) -> dict:
    return _sliding_all(c, _llama_like(c, default_seq=131072), default=4096)


def mixtral(c: _Config) -> dict:
    out = _sliding_all(c, _llama_like(c, default_seq=131072))
    out["moe"] = {"experts": c.get("num_local_experts", 8), "top_k": c.get("num_experts_per_tok", 2)}
    return out


def qwen2(c: _Config) -> dict:
    # Qwen2Attention: q, k and v carry biases, o does not
    return _llama_like(c, qkv_bias=True, default_seq=32768)


def qwen3(c: _Config) -> dict:
    out = _llama_like(c, default_seq=32768)
    out["qk_norm"] = True
    out.setdefault("head_dim", 128)
    return out


def qwen3_moe(c: _Config) -> dict:
    out = qwen3(c)
    if c.get("mlp_only_layers", []) or c.get("decoder_sparse_step", 1) != 1:
        raise SpecError(f"{c.where}: mlp_only_layers / decoder_sparse_step other than every layer "
                        "sparse are not supported")
    out["moe"] = {"experts": c.get("num_experts", 128), "top_k": c.get("num_experts_per_tok", 8),
                  "expert_ffn_hidden": c.get("moe_intermediate_size", 768)}
    return out


def deepseek_v3(c: _Config) -> dict:
    out = _llama_like(c, default_seq=4096)
    out.pop("head_dim", None)
    if c.get("moe_layer_freq", 1) != 1:
        raise SpecError(f"{c.where}: moe_layer_freq other than 1 is not supported")
    out["mla"] = {"q_lora_rank": c.get("q_lora_rank", 1536),
                  "kv_lora_rank": c.get("kv_lora_rank", 512),
                  "qk_nope_head_dim": c.get("qk_nope_head_dim", 128),
                  "qk_rope_head_dim": c.get("qk_rope_head_dim", 64),
                  "v_head_dim": c.get("v_head_dim", 128)}
    out["kv_heads"] = out["heads"]
    out["moe"] = {"experts": c.get("n_routed_experts", 256),
                  "top_k": c.get("num_experts_per_tok", 8),
                  "expert_ffn_hidden": c.get("moe_intermediate_size", 2048),
                  "shared_experts": c.get("n_shared_experts", 1),
                  "router_bias": c.get("topk_method", "noaux_tc") == "noaux_tc"}
    out["first_dense_layers"] = c.get("first_k_dense_replace", 3)
    # multi-token prediction depths (DeepSeek-V3: 1; their weights are the checkpoint's
    # layers past num_hidden_layers)
    out["mtp_layers"] = c.get("num_nextn_predict_layers", 0)
    return out


def gpt_oss(c: _Config) -> dict:
    out = _llama_like(c, default_seq=131072)
    out["seq_len"] = c.get("initial_context_length", out["seq_len"])
    out.setdefault("head_dim", 64)
    bias = c.get("attention_bias", True)
    out.update(qkv_bias=bias, out_bias=bias, mlp_bias=True, attention_sinks=True,
               sliding_window=c.get("sliding_window", 128),
               sliding_window_pattern=_layer_types(c, "SF"))
    out["moe"] = {"experts": c.get("num_local_experts", 128),
                  "top_k": c.get("num_experts_per_tok", c.get("experts_per_token", 4)),
                  "router_bias": True}
    return out


def _gemma(c: _Config, default: str) -> dict:
    out = _llama_like(c, tied=True, default_seq=8192)
    out.setdefault("head_dim", 256)
    out.update(ffn_kind="geglu", post_norms=True, sliding_window=c.get("sliding_window", 4096),
               sliding_window_pattern=_layer_types(c, default))
    return out


def gemma2(c: _Config) -> dict:
    # Gemma2DecoderLayer: even layers slide
    return _gemma(c, "SF")


def gemma3(c: _Config) -> dict:
    # Gemma3: layer i is full when (i + 1) % sliding_window_pattern == 0
    every = c.get("sliding_window_pattern", 6)
    out = _gemma(c, "S" * (every - 1) + "F" if isinstance(every, int) and every >= 1 else "F")
    out["qk_norm"] = True
    return out


def gpt2(c: _Config) -> dict:
    hidden = c.need("n_embd")
    return {"layers": c.need("n_layer"), "hidden": hidden, "heads": c.need("n_head"),
            "vocab": c.need("vocab_size"), "seq_len": c.get("n_positions", 1024),
            "ffn_hidden": c.get("n_inner", 4 * hidden if isinstance(hidden, int) else 1),
            "ffn_kind": "gelu", "tied_embeddings": True, "bias": True, "norm": "layernorm",
            "position_embedding": "learned", "dropout": c.get("resid_pdrop", 0.1)}


def gpt_neox(c: _Config) -> dict:
    return {"layers": c.need("num_hidden_layers"), "hidden": c.need("hidden_size"),
            "heads": c.need("num_attention_heads"), "vocab": c.need("vocab_size"),
            "ffn_hidden": c.need("intermediate_size"), "ffn_kind": "gelu",
            "seq_len": c.get("max_position_embeddings", 2048),
            "tied_embeddings": c.get("tie_word_embeddings", False), "bias": True,
            "qkv_bias": c.get("attention_bias", True), "out_bias": c.get("attention_bias", True),
            "norm": "layernorm", "position_embedding": "rotary",
            "dropout": c.get("hidden_dropout", 0.0)}


# NemotronH block type names -> layer_pattern letters
_NEMOTRON_MARKS = {"mamba": "M", "linear_attention": "M", "attention": "*",
                   "full_attention": "*", "mlp": "-", "moe": "E"}


def nemotron_h(c: _Config) -> dict:
    heads = c.need("num_attention_heads")
    pattern = c.get("hybrid_override_pattern")
    if pattern is None and isinstance(c.get("layers_block_type"), list):
        pattern = "".join(_NEMOTRON_MARKS.get(t, "?") for t in c.get("layers_block_type"))
    if pattern is None:
        c.missing.append("hybrid_override_pattern")
        pattern = "-"
    out = {"layers": len(pattern), "hidden": c.need("hidden_size"), "heads": heads,
           "kv_heads": c.get("num_key_value_heads", heads), "vocab": c.need("vocab_size"),
           "ffn_hidden": c.get("intermediate_size", 21504),
           "ffn_kind": "relu2" if c.get("mlp_hidden_act", "relu2") == "relu2" else "gelu",
           "seq_len": c.get("max_position_embeddings", 4096),
           "tied_embeddings": c.get("tie_word_embeddings", False), "bias": False,
           "qkv_bias": c.get("attention_bias", False), "out_bias": c.get("attention_bias", False),
           "mlp_bias": c.get("mlp_bias", False), "norm": "rmsnorm",
           "position_embedding": "rotary", "layer_pattern": pattern,
           "head_dim": c.get("attention_head_dim", c.get("head_dim", 128))}
    if "M" in pattern:
        out["mamba"] = {"state_size": c.get("ssm_state_size", 128),
                        "heads": c.get("mamba_num_heads", 128),
                        "head_dim": c.get("mamba_head_dim", 64),
                        "n_groups": c.get("n_groups", 8), "conv_kernel": c.get("conv_kernel", 4),
                        "expand": c.get("expand", 2), "chunk_size": c.get("chunk_size", 128),
                        "conv_bias": c.get("use_conv_bias", True),
                        "proj_bias": c.get("use_bias", False)}
    mtp = c.get("num_nextn_predict_layers", 0)
    if mtp:  # the HF NemotronH MTP depth: mtp_layers_block_type (Nemotron 3 Super: *E)
        out["mtp_layers"] = mtp
        kinds = c.get("mtp_layers_block_type")
        if isinstance(kinds, list) and kinds:
            out["mtp_pattern"] = "".join(_NEMOTRON_MARKS.get(k, "?") for k in kinds)
        else:
            c.missing.append("mtp_layers_block_type")
    if "E" in pattern:
        out["moe"] = {"experts": c.get("n_routed_experts", 8),
                      "top_k": c.get("num_experts_per_tok", 2),
                      "expert_ffn_hidden": c.get("moe_intermediate_size", 7688),
                      "shared_experts": c.get("n_shared_experts", 1),
                      "shared_expert_ffn_hidden": c.get("moe_shared_expert_intermediate_size", 7688),
                      "router_bias": True}
        if c.get("moe_latent_size") is not None:  # LatentMoE (Nemotron 3 Super)
            out["moe"]["latent_size"] = c.get("moe_latent_size")
    return out


ARCHITECTURES: dict[str, Callable[[_Config], dict]] = {
    "LlamaForCausalLM": llama, "MistralForCausalLM": mistral, "MixtralForCausalLM": mixtral,
    "Qwen2ForCausalLM": qwen2, "Qwen3ForCausalLM": qwen3, "Qwen3MoeForCausalLM": qwen3_moe,
    "DeepseekV3ForCausalLM": deepseek_v3, "GptOssForCausalLM": gpt_oss,
    "Gemma2ForCausalLM": gemma2, "Gemma3ForCausalLM": gemma3, "GPT2LMHeadModel": gpt2,
    "GPTNeoXForCausalLM": gpt_neox, "NemotronHForCausalLM": nemotron_h,
}


# planner's model keys -> the config.json keys most architectures read them from (an error
# in a value names the file's key)
CONFIG_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size",
               "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
               "vocab": "vocab_size", "ffn_hidden": "intermediate_size",
               "seq_len": "max_position_embeddings"}


def from_config(data: Any, where: str, name: str | None = None) -> Transformer:
    """The transformer a config.json dict describes."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: a config.json must be a JSON object, got {short(data)}")
    archs = data.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise SpecError(f"{where}: key 'architectures': expected a list naming the model class "
                        f"(known: {', '.join(ARCHITECTURES)})")
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise SpecError(f"{where}: architecture {short(arch)} is not supported "
                        f"(known: {', '.join(ARCHITECTURES)})")
    config = _Config(data, where)
    keys = ARCHITECTURES[arch](config)
    config.check()
    spec = {"kind": "transformer", "name": name or data.get("_name_or_path") or arch,
            "description": f"{arch} from {where}", **keys,
            "sources": {"config": f"{where} ({arch})"}}
    if not isinstance(spec["name"], str) or not spec["name"]:
        spec["name"] = arch
    try:
        return build_transformer(spec, where)
    except SpecError as exc:  # name the config.json's own keys, not planner's
        text = str(exc)
        for ours, theirs in CONFIG_KEYS.items():
            if theirs in data:  # this architecture reads it under that name
                text = text.replace(f"key '{ours}'", f"key '{theirs}' (planner's '{ours}')")
        raise SpecError(text) from None


def config_path(ref: str) -> Path | None:
    """The config.json `ref` names (the file, or a folder holding one), or None."""
    path = Path(ref)
    if ref.endswith(".json"):
        return path
    try:
        if path.is_dir() and (path / "config.json").is_file():
            return path / "config.json"
    except (OSError, ValueError):
        return None
    return None


def load_config(path: Path) -> Transformer:
    """Read and map one config.json (bounded in size, numbers guarded)."""
    from planner.catalog import read_file, shown

    where = shown(path)
    raw = read_file(path, MAX_CONFIG_BYTES, "config.json")
    try:
        data = loads_json(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SpecError(f"{where}: not UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{where}: malformed JSON at line {exc.lineno}, column {exc.colno}: "
                        f"{exc.msg}") from None
    except RecursionError:
        raise SpecError(f"{where}: JSON nested too deeply") from None
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return from_config(data, where, name)
