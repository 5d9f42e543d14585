//! `K3Config::from_root`: every rule config.json must meet, each failure an error naming the
//! field and the rule.

use super::*;

use crate::Error;

impl K3Config {
    /// Validates a parsed root and derives the schedule.
    pub fn from_root(root: RootConfig) -> Result<Self> {
        let t = &root.text_config;
        check_dimensions(t)?;
        check_supported(&root)?;
        let schedule = schedule(t)?;
        let group_size = quantization(&root)?;
        let eos_token_id = eos_token(&root)?;
        Ok(K3Config {
            root,
            schedule,
            group_size,
            eos_token_id,
        })
    }
}

/// Every dimension is positive; top-k and the dense prefix fit.
fn check_dimensions(t: &TextConfig) -> Result<()> {
    let la = &t.linear_attn_config;
    let n = t.num_hidden_layers;
    Error::rule(n > 0, "text_config.num_hidden_layers", || {
        "must be > 0".into()
    })?;
    for (f, v) in [
        ("text_config.hidden_size", t.hidden_size),
        ("text_config.vocab_size", t.vocab_size),
        ("text_config.intermediate_size", t.intermediate_size),
        ("text_config.num_experts", t.num_experts),
        ("text_config.num_experts_per_token", t.num_experts_per_token),
        ("text_config.moe_intermediate_size", t.moe_intermediate_size),
        (
            "text_config.routed_expert_hidden_size",
            t.routed_expert_hidden_size,
        ),
        ("text_config.num_attention_heads", t.num_attention_heads),
        ("text_config.q_lora_rank", t.q_lora_rank),
        ("text_config.kv_lora_rank", t.kv_lora_rank),
        ("text_config.qk_nope_head_dim", t.qk_nope_head_dim),
        ("text_config.v_head_dim", t.v_head_dim),
        ("text_config.attn_res_block_size", t.attn_res_block_size),
        ("text_config.moe_layer_freq", t.moe_layer_freq),
        ("text_config.linear_attn_config.num_heads", la.num_heads),
        ("text_config.linear_attn_config.head_dim", la.head_dim),
        (
            "text_config.linear_attn_config.short_conv_kernel_size",
            la.short_conv_kernel_size,
        ),
    ] {
        Error::rule(v > 0, f, || "must be > 0".into())?;
    }
    Error::rule(
        t.num_experts_per_token <= t.num_experts,
        "text_config.num_experts_per_token",
        || {
            format!(
                "top-k {} must be <= num_experts {}",
                t.num_experts_per_token, t.num_experts
            )
        },
    )?;
    Error::rule(
        t.first_k_dense_replace <= n,
        "text_config.first_k_dense_replace",
        || format!("{} exceeds num_hidden_layers {n}", t.first_k_dense_replace),
    )?;
    Ok(())
}

/// Fields the forward pass implements only K3's value of.
fn check_supported(root: &RootConfig) -> Result<()> {
    let t = &root.text_config;
    let la = &t.linear_attn_config;
    // Fields the forward pass does not implement other values of: fail closed rather than
    // compute a different function.
    Error::rule(
        t.routed_scaling_factor == 1.0,
        "text_config.routed_scaling_factor",
        || {
            format!(
                "{} is not supported: only 1.0 (K3's value; routed outputs are not scaled)",
                t.routed_scaling_factor
            )
        },
    )?;
    Error::rule(t.mla_use_nope, "text_config.mla_use_nope", || {
        "false is not supported: MLA here applies no rotary embedding (K3: true)".into()
    })?;
    Error::rule(
        t.mla_use_output_gate,
        "text_config.mla_use_output_gate",
        || "false is not supported: MLA here always applies its output gate (K3: true)".into(),
    )?;
    Error::rule(
        la.use_full_rank_gate,
        "text_config.linear_attn_config.use_full_rank_gate",
        || "false is not supported: KDA's g_proj is full rank here (K3: true)".into(),
    )?;
    Error::rule(
        t.num_key_value_heads == t.num_attention_heads,
        "text_config.num_key_value_heads",
        || "must equal num_attention_heads (MLA has no grouped KV heads)".into(),
    )?;
    Error::rule(
        !t.use_grouped_topk || t.num_expert_group == 1 || t.topk_group == t.num_expert_group,
        "text_config.num_expert_group",
        || "grouped top-k with more than one group is not supported".into(),
    )?;
    Error::rule(
        t.moe_router_activation_func == "sigmoid",
        "text_config.moe_router_activation_func",
        || {
            format!(
                "`{}` unsupported; only `sigmoid`",
                t.moe_router_activation_func
            )
        },
    )?;
    Error::rule(t.hidden_act == "situ", "text_config.hidden_act", || {
        format!("`{}` unsupported; only `situ`", t.hidden_act)
    })?;
    Error::rule(
        t.rms_norm_eps > 0.0 && t.rms_norm_eps.is_finite(),
        "text_config.rms_norm_eps",
        || "must be a positive finite number".into(),
    )?;
    Error::rule(
        la.gate_lower_bound < 0.0 && la.gate_lower_bound.is_finite(),
        "text_config.linear_attn_config.gate_lower_bound",
        || "must be a negative finite number".into(),
    )?;
    Error::rule(
        !root.tie_word_embeddings && !t.tie_word_embeddings,
        "tie_word_embeddings",
        || "tied embeddings are not supported (K3 has a separate lm_head)".into(),
    )?;

    Ok(())
}

/// Each layer's attention and feed-forward kind.
fn schedule(t: &TextConfig) -> Result<Vec<LayerKind>> {
    let la = &t.linear_attn_config;
    let n = t.num_hidden_layers;
    // Schedule: every layer in exactly one list.
    let mut attn: Vec<Option<AttnKind>> = vec![None; n];
    for (list, kind, field) in [
        (
            &la.kda_layers,
            AttnKind::Kda,
            "text_config.linear_attn_config.kda_layers",
        ),
        (
            &la.full_attn_layers,
            AttnKind::Mla,
            "text_config.linear_attn_config.full_attn_layers",
        ),
    ] {
        for &one_based in list {
            Error::rule((1..=n).contains(&one_based), field, || {
                format!("layer {one_based} is outside 1..={n} (the lists are one-based)")
            })?;
            let slot = &mut attn[one_based - 1];
            Error::rule(slot.is_none(), field, || {
                format!("layer {one_based} appears twice across kda_layers/full_attn_layers")
            })?;
            *slot = Some(kind);
        }
    }
    let mut schedule = Vec::with_capacity(n);
    for (l, a) in attn.iter().enumerate() {
        let attn = a.ok_or_else(|| {
            Error::config(
                "text_config.linear_attn_config",
                format!(
                    "layer {} (one-based) is in neither kda_layers nor full_attn_layers",
                    l + 1
                ),
            )
        })?;
        let moe = l >= t.first_k_dense_replace && l % t.moe_layer_freq == 0;
        schedule.push(LayerKind {
            attn,
            ffn: if moe { FfnKind::Moe } else { FfnKind::Dense },
        });
    }

    Ok(schedule)
}

/// The routed experts' MXFP4 group size, and its divisibility rules.
fn quantization(root: &RootConfig) -> Result<usize> {
    let t = &root.text_config;
    // MXFP4 quantisation of the routed experts.
    let q = t
        .quantization_config
        .as_ref()
        .or(root.quantization_config.as_ref())
        .ok_or_else(|| {
            Error::config(
                "text_config.quantization_config",
                "missing: routed experts must be MXFP4 (compressed-tensors)",
            )
        })?;
    Error::rule(
        q.format == "mxfp4-pack-quantized",
        "quantization_config.format",
        || format!("`{}` unsupported; only `mxfp4-pack-quantized`", q.format),
    )?;
    let mut group_size = None;
    for (name, g) in &q.config_groups {
        let field = format!("quantization_config.config_groups.{name}.weights");
        Error::rule(
            g.weights.num_bits == 4 && g.weights.kind == "float",
            &field,
            || "MXFP4 needs num_bits 4 and type float".into(),
        )?;
        Error::rule(
            g.weights.group_size == 32,
            &format!("{field}.group_size"),
            || format!("MXFP4 group size must be 32, got {}", g.weights.group_size),
        )?;
        group_size = Some(g.weights.group_size);
    }
    let group_size = group_size.ok_or_else(|| {
        Error::config("quantization_config.config_groups", "no quantisation group")
    })?;

    // Dimension divisibility for the packed experts: inputs are whole groups.
    for (f, v) in [
        (
            "text_config.routed_expert_hidden_size",
            t.routed_expert_hidden_size,
        ),
        ("text_config.moe_intermediate_size", t.moe_intermediate_size),
    ] {
        Error::rule(v % group_size == 0, f, || {
            format!("{v} must be a multiple of the MXFP4 group size {group_size}")
        })?;
    }
    Ok(group_size)
}

/// The generation stop token.
fn eos_token(root: &RootConfig) -> Result<u32> {
    let t = &root.text_config;
    let eos_token_id = root.eos_token_id.or(t.eos_token_id).ok_or_else(|| {
        Error::config(
            "eos_token_id",
            "missing (needed as the generation stop token)",
        )
    })?;
    Error::rule(
        (eos_token_id as usize) < t.vocab_size,
        "eos_token_id",
        || {
            format!(
                "{eos_token_id} is outside the vocabulary ({})",
                t.vocab_size
            )
        },
    )?;

    Ok(eos_token_id)
}
