//! `SpineReport`: what the spine looks like once loaded (format, pinned and streamed layers,
//! bytes read per token, the streamed layers' files), for reports and benchmark bounds. Owns
//! the report's shape; the spine fills it (`Spine::report`).

use super::convert::SpineFormat;

/// What the spine looks like at startup.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SpineReport {
    /// bf16 or int8.
    #[serde(serialize_with = "ser_format")]
    pub format: SpineFormat,
    /// From the converted store (else the shards).
    pub from_store: bool,
    /// Layers pinned in RAM.
    pub layers_pinned: usize,
    /// Layers streamed every token.
    pub layers_streamed: usize,
    /// Bytes of pinned layers.
    pub resident_bytes: u64,
    /// Spine bytes read per token.
    pub bytes_read_per_token: u64,
    /// Whether streamed layers are read with `O_DIRECT`.
    pub direct: bool,
    /// Whether streamed layers are mapped from the store for each pass (a memory budget below
    /// one layer: `SpineOptions::mapped`).
    pub mapped: bool,
    /// The store files of the streamed layers (empty when the spine comes from the shards):
    /// the bytes a token re-reads, which a storage bound should be measured on.
    #[serde(skip)]
    pub streamed_files: Vec<std::path::PathBuf>,
}

fn ser_format<S: serde::Serializer>(f: &SpineFormat, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(f.dir_name())
}
