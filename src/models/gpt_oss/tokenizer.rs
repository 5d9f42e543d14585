//! gpt-oss's tokenizer: the checkpoint's `tokenizer.json` (o200k_harmony on the hub) as a
//! `tokenizers::Tokenizer`, with text encoded so that special spellings inside it stay text
//! (`encode_special_tokens`), harmony's specials looked up by name, and harmony segments turned
//! into ids. Reads only `tokenizer.json`.

use std::path::Path;

use crate::chat::harmony::{HarmonyIds, CALL, CHANNEL, END, MESSAGE, RETURN, START};
use crate::chat::Segment;
use crate::{Error, Result};

/// o200k's split pattern (the fixture's tokenizer.json uses it; a hub tokenizer.json brings its
/// own pre-tokenizer).
pub const O200K_PATTERN: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// gpt-oss's tokenizer and its harmony ids.
pub struct GptOssTokenizer {
    tk: tokenizers::Tokenizer,
    ids: HarmonyIds,
}

impl GptOssTokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let mut tk = tokenizers::Tokenizer::from_file(&path).map_err(|e| Error::Msg(format!(
            "{}: {e} (gpt-oss needs the checkpoint's tokenizer.json for text; --prompt-ids works without it)",
            path.display()
        )))?;
        tk.set_encode_special_tokens(true);
        let id = |s: &str| {
            tk.token_to_id(s).ok_or_else(|| {
                Error::Msg(format!(
                    "{}: harmony's `{s}` is not in the vocabulary",
                    path.display()
                ))
            })
        };
        let ids = HarmonyIds {
            start: id(START)?,
            message: id(MESSAGE)?,
            end: id(END)?,
            channel: id(CHANNEL)?,
            ret: id(RETURN)?,
            call: id(CALL)?,
        };
        Ok(GptOssTokenizer { tk, ids })
    }

    /// Harmony's special ids.
    pub fn harmony_ids(&self) -> HarmonyIds {
        self.ids
    }

    /// Text to ids; special spellings in it are text.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .tk
            .encode(text, false)
            .map_err(|e| Error::Msg(format!("tokenizer: {e}")))?
            .get_ids()
            .to_vec())
    }

    /// Segments to ids: control segments are specials by name, text is text.
    pub fn encode_segments(&self, segs: &[Segment]) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        for s in segs {
            match s {
                Segment::Control(t) => out.push(self.tk.token_to_id(t).ok_or_else(|| {
                    Error::Msg(format!("tokenizer: `{t}` is not a special token"))
                })?),
                Segment::Text(t) => out.extend(self.encode(t)?),
            }
        }
        Ok(out)
    }

    /// An owned decoder (for `HarmonySplitter`'s channel names).
    pub fn decoder(&self) -> impl Fn(&[u32]) -> String + Send + Sync + 'static {
        let tk = self.tk.clone();
        move |ids: &[u32]| tk.decode(ids, true).unwrap_or_default()
    }

    /// Ids to text (specials dropped).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.tk.decode(ids, true).unwrap_or_default()
    }
}
