//! `deltafin eagle3-logits` and `dflash-logits`: a draft head run over given inputs, its
//! logits printed as JSON, so another implementation of the head run on the same files
//! (`scripts/eagle3_reference.py`, `scripts/dflash_reference.py` run vLLM `speculators`'
//! modules) can be compared with this one.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use safetensors::{Dtype, SafeTensors};

use deltafin::drafters::dflash::{ContextCache, DFlashHead};
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

fn i64s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as u32)
        .collect()
}

/// The input file's `input_ids` and `hidden_states` rows (one per id).
fn inputs(path: &std::path::Path) -> anyhow::Result<(Vec<u32>, Vec<f32>, Vec<u32>)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{} is not a safetensors file", path.display()))?;
    let ids = i64s(tensor(&st, "input_ids", Dtype::I64)?.0);
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
    let anchors = match st.tensor("anchors") {
        Ok(_) => i64s(tensor(&st, "anchors", Dtype::I64)?.0),
        Err(_) => Vec::new(),
    };
    Ok((ids, taps, anchors))
}

/// Runs `deltafin eagle3-logits`.
pub fn run(a: &Eagle3Args) -> anyhow::Result<()> {
    let head = Eagle3Head::open(&a.drafter)?;
    let (ids, taps, _) = inputs(&a.input)?;
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

/// Arguments of `dflash-logits`.
#[derive(Debug, Args)]
pub struct DFlashArgs {
    /// The head's directory (config.json and safetensors, either published spelling).
    #[arg(long)]
    pub drafter: PathBuf,
    /// A safetensors file holding `input_ids` (I64 `[T]`), `hidden_states` (F32 `[T, n·Ht]`,
    /// the target's tapped rows at each position) and `anchors` (I64, ascending positions
    /// below `T`: a block is drafted at each, over the rows of the positions before it; a
    /// DSpark head's sequential bias follows the block's true tokens from `input_ids`).
    #[arg(long)]
    pub input: PathBuf,
}

/// Runs `deltafin dflash-logits`: the context is read in pieces, between anchors, as the
/// drafter reads it while decoding.
pub fn run_dflash(a: &DFlashArgs) -> anyhow::Result<()> {
    let head = DFlashHead::open(&a.drafter)?;
    let (ids, taps, anchors) = inputs(&a.input)?;
    let w = taps.len() / ids.len().max(1);
    let vd = head.config().draft_vocab;
    let mut cache = ContextCache::starting_at(0);
    let (mut logits, mut target) = (Vec::new(), Vec::new());
    for &at in &anchors {
        let at = at as usize;
        anyhow::ensure!(
            at < ids.len() && at >= cache.end(),
            "anchor {at}: anchors must ascend below {}",
            ids.len()
        );
        if at > cache.end() {
            head.extend(&taps[cache.end() * w..at * w], &mut cache)?;
        }
        let block = head.block(ids[at], &mut cache)?;
        // DSpark's bias follows the true tokens of the block where the input holds them.
        let forced = ids.get(at..at + head.config().block_size);
        let (l, _) = head.chain(&block, ids[at], forced)?;
        let rows: Vec<Vec<f32>> = l.chunks(vd).map(<[f32]>::to_vec).collect();
        target.push(
            rows.iter()
                .map(|r| head.target_id(deltafin::runtime::generate::argmax(r) as usize))
                .collect::<Vec<u32>>(),
        );
        logits.push(rows);
    }
    let doc = serde_json::json!({"logits": logits, "target_ids": target});
    println!("{}", serde_json::to_string(&doc)?);
    Ok(())
}
