use super::*;

/// Real K3's config values (spec §1.2) as JSON.
pub(crate) fn k3_json() -> serde_json::Value {
    let mla: Vec<usize> = (1..=93).filter(|l| l % 4 == 0 || *l == 93).collect();
    let kda: Vec<usize> = (1..=93).filter(|l| !mla.contains(l)).collect();
    serde_json::json!({
        "model_type": "kimi_k3", "dtype": "bfloat16", "tie_word_embeddings": false,
        "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
        "text_config": {
            "model_type": "kimi_linear", "hidden_size": 7168, "num_hidden_layers": 93,
            "vocab_size": 163840, "max_position_embeddings": 1048576,
            "intermediate_size": 33792, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "num_experts": 896, "num_experts_per_token": 16, "num_shared_experts": 2,
            "moe_intermediate_size": 3072, "routed_expert_hidden_size": 3584,
            "latent_moe_use_norm": true, "moe_router_activation_func": "sigmoid",
            "topk_method": "noaux_tc", "use_grouped_topk": true, "num_expert_group": 1,
            "topk_group": 1, "moe_renormalize": true, "routed_scaling_factor": 1.0,
            "hidden_act": "situ", "activation_situ_beta": 4.0,
            "activation_situ_linear_beta": 25.0, "rms_norm_eps": 1e-5,
            "num_attention_heads": 96, "num_key_value_heads": 96, "q_lora_rank": 1536,
            "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "mla_use_nope": true, "mla_use_output_gate": true,
            "attn_res_block_size": 12, "num_nextn_predict_layers": 0, "use_cache": true,
            "dtype": "bfloat16", "tie_word_embeddings": false,
            "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
            "linear_attn_config": {
                "num_heads": 96, "head_dim": 128, "short_conv_kernel_size": 4,
                "use_full_rank_gate": true, "gate_lower_bound": -5.0,
                "kda_layers": kda, "full_attn_layers": mla
            },
            "quantization_config": {
                "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
                "quantization_status": "compressed",
                "config_groups": {"group_0": {"format": "mxfp4-pack-quantized",
                    "weights": {"num_bits": 4, "type": "float", "strategy": "group",
                        "group_size": 32, "symmetric": true, "dynamic": false,
                        "observer": "minmax", "scale_dtype": "torch.uint8"}}}
            }
        }
    })
}

#[test]
fn real_k3_config_schedule() {
    let c = K3Config::from_json(&k3_json().to_string()).unwrap();
    assert_eq!(c.num_layers(), 93);
    let mla: Vec<usize> = (0..93)
        .filter(|&l| c.schedule[l].attn == AttnKind::Mla)
        .collect();
    assert_eq!(mla.len(), 24);
    assert!(mla.iter().all(|&l| l % 4 == 3 || l == 92));
    assert!(mla.contains(&92));
    assert_eq!(c.schedule[0].ffn, FfnKind::Dense);
    assert_eq!(c.schedule[0].attn, AttnKind::Kda);
    assert_eq!(c.moe_layers().count(), 92);
    assert_eq!(c.expert_span_bytes(), 17_547_264);
    assert_eq!(c.shared_width(), 6144);
    assert_eq!(c.eos_token_id, 163586);
}

fn expect_err(mutate: impl FnOnce(&mut serde_json::Value), field_part: &str) {
    let mut j = k3_json();
    mutate(&mut j);
    match K3Config::from_json(&j.to_string()) {
        Err(Error::Config { field, rule }) => {
            assert!(field.contains(field_part), "field {field} rule {rule}")
        }
        other => panic!("expected config error on {field_part}, got {other:?}"),
    }
}

#[test]
fn validation_names_field_and_rule() {
    expect_err(
        |j| j["text_config"]["linear_attn_config"]["kda_layers"] = serde_json::json!([1, 2]),
        "linear_attn_config",
    );
    expect_err(
        |j| {
            j["text_config"]["linear_attn_config"]["full_attn_layers"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!(1))
        },
        "full_attn_layers",
    );
    expect_err(
        |j| {
            j["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]
                ["group_size"] = 16.into()
        },
        "group_size",
    );
    expect_err(
        |j| j["text_config"]["num_experts_per_token"] = 900.into(),
        "num_experts_per_token",
    );
    expect_err(
        |j| j["text_config"]["routed_expert_hidden_size"] = 3585.into(),
        "routed_expert_hidden_size",
    );
    expect_err(
        |j| j["text_config"]["linear_attn_config"]["full_attn_layers"] = serde_json::json!([0]),
        "full_attn_layers",
    );
    // Parsed fields whose other values the forward pass does not implement are refused.
    expect_err(
        |j| j["text_config"]["routed_scaling_factor"] = 2.5.into(),
        "routed_scaling_factor",
    );
    expect_err(
        |j| j["text_config"]["mla_use_nope"] = false.into(),
        "mla_use_nope",
    );
    expect_err(
        |j| j["text_config"]["mla_use_output_gate"] = false.into(),
        "mla_use_output_gate",
    );
    expect_err(
        |j| j["text_config"]["linear_attn_config"]["use_full_rank_gate"] = false.into(),
        "use_full_rank_gate",
    );
}

#[test]
fn malformed_json_is_an_error() {
    assert!(K3Config::from_json("{").is_err());
    assert!(K3Config::from_json("{\"text_config\": 3}").is_err());
}
