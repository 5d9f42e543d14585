//! The crate's error type.

use std::path::PathBuf;

/// Every failure the library reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Candle tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle::Error),

    /// An I/O error on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// config.json is malformed or violates a rule.
    #[error("config: field `{field}`: {rule}")]
    Config {
        /// Dotted path of the offending field.
        field: String,
        /// The rule that was broken.
        rule: String,
    },

    /// A saved state file (a prompt-cache entry or a saved session) that cannot be used.
    #[error("{path}: {msg}")]
    StateFile {
        /// The file.
        path: PathBuf,
        /// Truncated or damaged (a cache removes it) rather than foreign (another checkpoint,
        /// format version or model shape: refused, left in place).
        corrupt: bool,
        /// What is wrong, and what to do.
        msg: String,
    },

    /// A safetensors shard is malformed.
    #[error("{path}: {msg}")]
    Shard {
        /// The shard file (or a label for in-memory bytes).
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },

    /// The checkpoint as a whole is inconsistent (missing tensor, duplicate, bad expert).
    #[error("checkpoint {dir}: {msg}")]
    Checkpoint {
        /// The model directory.
        dir: PathBuf,
        /// What is wrong.
        msg: String,
    },

    /// A tensor has the wrong dtype or shape for its role.
    #[error("tensor `{name}`: {msg}")]
    Tensor {
        /// The tensor name.
        name: String,
        /// What is wrong.
        msg: String,
    },

    /// A sequence would grow past the context limit.
    #[error("context limit: {needed} tokens needed, the limit is {limit} (raise it with --context, within the model's max_position_embeddings and the memory plan)")]
    ContextLimit {
        /// Positions the sequence would hold.
        needed: usize,
        /// The limit.
        limit: usize,
    },

    /// MXFP4 data has the wrong size or shape.
    #[error("mxfp4: {0}")]
    Mxfp4(String),

    /// JSON that could not be parsed.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },

    /// config.json names a `model_type` no registered family runs.
    #[error("{path}: model_type {found} is not a family this build runs (known: {known}); check that the directory holds the model you meant, or add the family under src/models/")]
    UnknownFamily {
        /// The config.json read.
        path: PathBuf,
        /// The value found (quoted), or `missing`.
        found: String,
        /// The model types the registered families accept.
        known: String,
    },

    /// Anything else, described in words.
    #[error("{0}")]
    Msg(String),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An I/O error tagged with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// `Ok` when `ok`, else a config error naming `field` (every family's config rules use it).
    pub fn rule(ok: bool, field: &str, msg: impl FnOnce() -> String) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(Error::config(field, msg()))
        }
    }

    /// A config rule violation.
    pub fn config(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Error::Config {
            field: field.into(),
            rule: rule.into(),
        }
    }
}
