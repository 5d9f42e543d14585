//! Transformer pieces a family built on mapped dense tensors and key/value row caches may use
//! (gpt-oss, Qwen3-MoE, a Candle user's own): the mapped tensors and `x · Wᵀ` over them
//! (`mapped`), RMSNorm (`norm`), NeoX-style rotary (`rope`), grouped-query attention with
//! optional sinks and windows over a row cache (`attention`), and the `Model` behaviour of a
//! row-cache family (`row_pass`: the layer loop, prefill passes, cancel, verify, batching).
//! Knows no family: names, shapes and forward order come from the caller.

pub mod attention;
pub mod mapped;
pub mod norm;
pub mod plan;
pub mod rope;
pub mod row_model;
pub mod row_pass;
