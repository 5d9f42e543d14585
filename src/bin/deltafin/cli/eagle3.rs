//! `deltafin eagle3-logits`: one EAGLE-3 head step over given inputs, printed as JSON, so
//! another implementation of the head run on the same files (`scripts/eagle3_reference.py`
//! runs vLLM `speculators`' module) can be compared with this one.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use safetensors::{Dtype, SafeTensors};

use deltafin::drafters::eagle3::{DraftCache, Eagle3Head, HeadInput};

/// Arguments of `eagle3-logits`.
#[derive(Debug, Args)]
pub struct Eagle3Args {
    /// The head's directory (config.json and safetensors, either published spelling).
    #[arg(long)]
    pub drafter: PathBuf,
    /// A safetensors file holding `input_ids` (I64 `[T]`, the tokens whose embeddings the
    /// head reads) and `hidden_states` (F32 `[T, 3·Ht]`, the target's tapped rows).
    #[arg(long)]
    pub input: PathBuf,
}

fn tensor<'a>(
    st: &'a SafeTensors<'a>,
    name: &str,
    dtype: Dtype,
) -> anyhow::Result<(&'a [u8], Vec<usize>)> {
    let t = st
        .tensor(name)
        .with_context(|| format!("the input has no tensor `{name}`"))?;
    anyhow::ensure!(
        t.dtype() == dtype,
        "`{name}` is {:?}, expected {dtype:?}",
        t.dtype()
    );
    Ok((t.data(), t.shape().to_vec()))
}

/// Runs `deltafin eagle3-logits`.
pub fn run(a: &Eagle3Args) -> anyhow::Result<()> {
    let head = Eagle3Head::open(&a.drafter)?;
    let bytes =
        std::fs::read(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{} is not a safetensors file", a.input.display()))?;
    let (ids, _) = tensor(&st, "input_ids", Dtype::I64)?;
    let ids: Vec<u32> = ids
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as u32)
        .collect();
    let (hs, shape) = tensor(&st, "hidden_states", Dtype::F32)?;
    anyhow::ensure!(
        shape.first() == Some(&ids.len()),
        "hidden_states has {shape:?} rows for {} ids",
        ids.len()
    );
    let taps: Vec<f32> = hs
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let embeds = head.embed(&ids)?;
    let out = head.step(&embeds, HeadInput::Taps(&taps), &mut DraftCache::default())?;
    let vd = head.config().draft_vocab;
    let logits: Vec<&[f32]> = out.logits.chunks(vd).collect();
    let target: Vec<u32> = logits
        .iter()
        .map(|row| head.target_id(deltafin::runtime::generate::argmax(row) as usize))
        .collect();
    let doc = serde_json::json!({"logits": logits, "target_ids": target});
    println!("{}", serde_json::to_string(&doc)?);
    Ok(())
}
