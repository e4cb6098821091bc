"""Hugging Face config.json files mapped to transformer specs: exact parameter counts from
configs written here (trimmed copies of the published ones; no downloads), the errors, and the
CLI (`--model config.json` / a folder, `show model`)."""

from __future__ import annotations

import json

import pytest

from planner.catalog import load_model
from planner.errors import SpecError
from planner.spec.huggingface import ARCHITECTURES, from_config

LLAMA3_8B = {  # meta-llama/Meta-Llama-3-8B
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu"}
MISTRAL_7B = {  # mistralai/Mistral-7B-v0.1
    "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096,
    "tie_word_embeddings": False}
MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1
    "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
    "max_position_embeddings": 32768, "sliding_window": None, "tie_word_embeddings": False}
QWEN25_05B = {  # Qwen/Qwen2.5-0.5B
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": True,
    "use_sliding_window": False}
QWEN3_8B = {  # Qwen/Qwen3-8B
    "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
    "tie_word_embeddings": False, "attention_bias": False}
QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
    "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "head_dim": 128, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False}
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3
    "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_attention_heads": 128, "num_key_value_heads": 128,
    "num_hidden_layers": 61, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "topk_method": "noaux_tc",
    "num_nextn_predict_layers": 1, "vocab_size": 129280, "max_position_embeddings": 163840,
    "tie_word_embeddings": False}
GPT_OSS_120B = {  # openai/gpt-oss-120b
    "architectures": ["GptOssForCausalLM"], "hidden_size": 2880, "intermediate_size": 2880,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "num_hidden_layers": 36, "num_local_experts": 128, "num_experts_per_tok": 4,
    "experts_per_token": 4, "sliding_window": 128, "attention_bias": True,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "vocab_size": 201088,
    "initial_context_length": 4096, "max_position_embeddings": 131072,
    "tie_word_embeddings": False}
GPT_OSS_20B = {**GPT_OSS_120B, "num_hidden_layers": 24,  # openai/gpt-oss-20b
               "num_local_experts": 32, "layer_types": ["sliding_attention",
                                                        "full_attention"] * 12}
GEMMA2_2B = {  # google/gemma-2-2b
    "architectures": ["Gemma2ForCausalLM"], "hidden_size": 2304, "intermediate_size": 9216,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "num_hidden_layers": 26, "vocab_size": 256000, "sliding_window": 4096,
    "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh"}
GEMMA3_1B = {  # google/gemma-3-1b-pt
    "architectures": ["Gemma3ForCausalLM"], "hidden_size": 1152, "intermediate_size": 6912,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "num_hidden_layers": 26, "vocab_size": 262144, "sliding_window": 512,
    "sliding_window_pattern": 6, "max_position_embeddings": 32768}
GPT2 = {  # openai-community/gpt2
    "architectures": ["GPT2LMHeadModel"], "n_embd": 768, "n_head": 12, "n_layer": 12,
    "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257, "n_inner": None}
PYTHIA_160M = {  # EleutherAI/pythia-160m
    "architectures": ["GPTNeoXForCausalLM"], "hidden_size": 768, "intermediate_size": 3072,
    "num_attention_heads": 12, "num_hidden_layers": 12, "vocab_size": 50304,
    "max_position_embeddings": 2048, "rotary_pct": 0.25, "use_parallel_residual": True,
    "tie_word_embeddings": False}
NEMOTRON_H_8B = {  # nvidia/Nemotron-H-8B-Base-8K
    "architectures": ["NemotronHForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 52,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "num_attention_heads": 32, "num_key_value_heads": 8, "attention_head_dim": 128,
    "intermediate_size": 21504, "mlp_hidden_act": "relu2", "ssm_state_size": 128,
    "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "conv_kernel": 4,
    "expand": 2, "chunk_size": 128, "use_conv_bias": True, "use_bias": False,
    "mlp_bias": False, "attention_bias": False, "vocab_size": 131072,
    "max_position_embeddings": 8192, "tie_word_embeddings": False}
NEMOTRON_3_SUPER = {  # nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16, as the Megatron-LM
    # release config describes it (keys of the HF NemotronH config, LatentMoE and MTP ones too)
    "architectures": ["NemotronHForCausalLM"], "hidden_size": 4096,
    "hybrid_override_pattern": "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*"
                               "EMEMEMEMEM*EMEMEMEM*EMEMEMEME",
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
    "mlp_hidden_act": "relu2", "ssm_state_size": 128, "mamba_num_heads": 128,
    "mamba_head_dim": 64, "n_groups": 8, "conv_kernel": 4, "expand": 2, "chunk_size": 128,
    "use_conv_bias": True, "use_bias": False, "mlp_bias": False, "attention_bias": False,
    "vocab_size": 131072, "max_position_embeddings": 8192, "tie_word_embeddings": False,
    "n_routed_experts": 512, "num_experts_per_tok": 22, "moe_intermediate_size": 2688,
    "n_shared_experts": 1, "moe_shared_expert_intermediate_size": 5376,
    "moe_latent_size": 1024, "num_nextn_predict_layers": 2,
    "mtp_layers_block_type": ["attention", "moe"]}

# (config, exact parameters, the published headline in billions and its decimals; the headline
# counts the main model: DeepSeek-V3's 671B leaves out its multi-token prediction depth)
CASES = {
    "llama3-8b": (LLAMA3_8B, 8_030_261_248, 8.0, 1),
    "mistral-7b": (MISTRAL_7B, 7_241_732_096, 7.24, 2),
    "mixtral-8x7b": (MIXTRAL_8X7B, 46_702_792_704, 46.7, 1),
    "qwen2.5-0.5b": (QWEN25_05B, 494_032_768, 0.49, 2),
    "qwen3-8b": (QWEN3_8B, 8_190_735_360, 8.2, 1),
    "qwen3-30b-a3b": (QWEN3_30B_A3B, 30_532_122_624, 30.5, 1),
    "deepseek-v3": (DEEPSEEK_V3, 682_636_487_424, 671, 0),
    "gpt-oss-120b": (GPT_OSS_120B, 116_829_156_672, 116.83, 2),
    "gpt-oss-20b": (GPT_OSS_20B, 20_914_757_184, 20.91, 2),
    "gemma-2-2b": (GEMMA2_2B, 2_614_341_888, 2.61, 2),
    "gemma-3-1b": (GEMMA3_1B, 999_885_952, 1.0, 1),
    "gpt2": (GPT2, 124_439_808, 0.124, 3),
    "pythia-160m": (PYTHIA_160M, 162_322_944, 0.162, 3),
    "nemotron-h-8b": (NEMOTRON_H_8B, 8_100_852_736, 8, 0),
    "nemotron-3-super": (NEMOTRON_3_SUPER, 126_553_358_336, 120, -1),
}


def test_every_architecture_has_a_case():
    assert {c[0]["architectures"][0] for c in CASES.values()} == set(ARCHITECTURES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_exact_parameters_from_the_config(name):
    config, params, headline, digits = CASES[name]
    m = from_config(config, f"{name}/config.json", name)
    assert m.params() == params
    assert round((params - m.mtp_params()) / 1e9, digits) == headline


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b",
                                  "gpt-oss-20b", "nemotron-h-8b", "nemotron-3-super"])
def test_config_and_builtin_agree(name):
    """The config.json and the built-in YAML describe one model: same counts, same FLOPs."""
    hf, builtin = from_config(CASES[name][0], "config.json", name), load_model(name)
    assert hf.params() == builtin.params()
    assert hf.active_params() == builtin.active_params()
    assert hf.layer_kinds() == builtin.layer_kinds()
    if hf.seq_len == builtin.seq_len:
        assert hf.model_flops() == builtin.model_flops()


def test_architecture_keys_understood():
    oss = from_config(GPT_OSS_120B, "c.json")
    assert (oss.sliding_window, oss.sliding_window_pattern[:4], oss.attention_sinks) == (
        128, "SFSF", True)
    assert oss.seq_len == 4096 and oss.head_dim == 64 and oss.q_dim == 4096
    gemma3 = from_config(GEMMA3_1B, "c.json")
    assert gemma3.sliding_window_pattern == "SSSSSF" and gemma3.qk_norm and gemma3.post_norms
    assert from_config(MISTRAL_7B, "c.json").sliding_window == 4096
    assert from_config(MIXTRAL_8X7B, "c.json").sliding_window == 0  # null: no window
    ds = from_config(DEEPSEEK_V3, "c.json")
    assert ds.first_dense_layers == 3 and ds.dense_ffn_hidden == 18432 and ds.ffn_hidden == 2048
    nh = from_config(NEMOTRON_H_8B, "c.json")
    assert [(k.name, n) for k, n in nh.layer_kinds()] == [("mamba", 24), ("dense", 24),
                                                          ("attention", 4)]


def test_unknown_architecture_is_one_line_naming_it_and_the_known_ones():
    with pytest.raises(SpecError) as err:
        from_config({"architectures": ["BertForMaskedLM"]}, "c.json")
    text = str(err.value)
    assert "\n" not in text and "'BertForMaskedLM'" in text and "LlamaForCausalLM" in text


def test_missing_required_keys_are_reported_together():
    config = {k: v for k, v in LLAMA3_8B.items()
              if k not in ("hidden_size", "vocab_size", "num_hidden_layers")}
    with pytest.raises(SpecError) as err:
        from_config(config, "c.json")
    text = str(err.value)
    assert all(k in text for k in ("'hidden_size'", "'vocab_size'", "'num_hidden_layers'"))


def test_bad_values_go_through_the_spec_checks():
    with pytest.raises(SpecError, match="kv_heads"):
        from_config({**LLAMA3_8B, "num_key_value_heads": 5}, "c.json")
    with pytest.raises(SpecError, match="architectures"):
        from_config({"hidden_size": 1}, "c.json")


def _write(folder, config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_model_option_takes_a_config_file_or_its_folder(tmp_path):
    folder = _write(tmp_path / "llama-3-8b", LLAMA3_8B)
    assert load_model(str(folder)).params() == 8_030_261_248
    assert load_model(str(folder / "config.json")).name == "llama-3-8b"


def test_malformed_json_is_a_spec_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"architectures": [')
    with pytest.raises(SpecError, match="malformed JSON"):
        load_model(str(bad))


def test_show_model_config_json(tmp_path, run):
    folder = _write(tmp_path / "ds", DEEPSEEK_V3)
    code, out, err = run("show", "model", str(folder / "config.json"))
    assert code == 0, err
    assert "682,636,487,424" in out and "kv_lora_rank 512" in out
    code, out, err = run("show", "model", str(folder), "--format", "json")
    assert code == 0 and json.loads(out)["params"] == 682_636_487_424
    bad = _write(tmp_path / "bert", {"architectures": ["BertForMaskedLM"]})
    code, out, err = run("show", "model", str(bad))
    assert code == 2 and "BertForMaskedLM" in err and len(err.strip().splitlines()) == 1


def test_evaluate_takes_a_config_json(tmp_path, run):
    folder = _write(tmp_path / "llama", LLAMA3_8B)
    code, out, err = run("evaluate", "--model", str(folder), "--hardware", "dgx-a100-80gb",
                         "--nodes", "1", "--global-batch", "8", "--format", "json")
    assert code == 0, err


def test_a_bad_value_names_the_config_json_key():
    """An error in a value read from config.json names the file's key (hidden_size), with
    planner's name beside it."""
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": -4096, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
           "intermediate_size": 14336, "max_position_embeddings": 8192}
    with pytest.raises(SpecError, match=r"key 'hidden_size' \(planner's 'hidden'\): "):
        from_config(cfg, "config.json")
