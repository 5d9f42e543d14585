//! The Hugging Face hub through hf-hub 1.x: byte-range fetches with retries, so `HF_ENDPOINT`,
//! `HF_TOKEN` and revisions behave as everywhere in the ecosystem; and a mock hub for tests.

#[cfg(feature = "server")]
pub mod mock;

use std::ops::Range;
use std::time::Duration;

use hf_hub::{HFClientBuilder, HFClientSync, HFRepositorySync, RepoTypeModel};

use crate::{Error, Result};

/// What a HEAD request says about a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    /// Size in bytes.
    pub size: u64,
    /// ETag, normalised (the content SHA-256 for LFS files).
    pub etag: String,
    /// The commit the revision resolved to (empty when the hub named none).
    pub commit: String,
}

/// One model repository on the hub.
pub struct HubRepo {
    repo: HFRepositorySync<RepoTypeModel>,
    id: String,
    revision: Option<String>,
    endpoint: String,
    /// Attempts per range (hf-hub retries transient statuses inside each attempt too).
    pub attempts: usize,
    /// First backoff delay; doubled after each failed attempt.
    pub backoff: Duration,
}

impl HubRepo {
    /// `repo_id` is `owner/name`; `endpoint` defaults to `HF_ENDPOINT` or huggingface.co.
    pub fn new(repo_id: &str, revision: Option<String>, endpoint: Option<String>) -> Result<Self> {
        let (owner, name) = repo_id
            .split_once('/')
            .ok_or_else(|| Error::Msg(format!("repository id `{repo_id}` is not owner/name")))?;
        let mut b = HFClientBuilder::new()
            .cache_enabled(false)
            .retry_max_attempts(3)
            .retry_base_delay(Duration::from_millis(50));
        if let Some(e) = &endpoint {
            b = b.endpoint(e.clone());
        }
        let inner = b
            .build()
            .map_err(|e| Error::Msg(format!("hub client: {e}")))?;
        let endpoint = inner.endpoint().to_string();
        let client =
            HFClientSync::from_inner(inner).map_err(|e| Error::Msg(format!("hub client: {e}")))?;
        Ok(HubRepo {
            repo: client.model(owner, name),
            id: repo_id.to_string(),
            revision,
            endpoint,
            attempts: 4,
            backoff: Duration::from_millis(100),
        })
    }

    /// The revision requests name (`main` when none was given).
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }

    /// The resolve URL of a file (for messages).
    pub fn url(&self, file: &str) -> String {
        format!(
            "{}/{}/resolve/{}/{file}",
            self.endpoint.trim_end_matches('/'),
            self.id,
            self.revision.as_deref().unwrap_or("main")
        )
    }

    /// A file's size, ETag and the commit the revision resolves to (one HEAD request).
    pub fn metadata(&self, file: &str) -> Result<FileMeta> {
        let m = self
            .repo
            .get_file_metadata()
            .filepath(file)
            .maybe_revision(self.revision.as_deref())
            .send()
            .map_err(|e| Error::Msg(format!("{}: {e}", self.url(file))))?;
        Ok(FileMeta {
            size: m.file_size,
            etag: m.etag,
            commit: m.commit_hash,
        })
    }

    /// The size of a file (HEAD).
    pub fn size(&self, file: &str) -> Result<u64> {
        self.metadata(file).map(|m| m.size)
    }

    /// The commit this repository's revision resolves to now (the hub's `X-Repo-Commit` for
    /// `file`).
    pub fn commit(&self, file: &str) -> Result<String> {
        let m = self.metadata(file)?;
        if m.commit.is_empty() {
            return Err(Error::Msg(format!(
                "{}: the hub named no commit (X-Repo-Commit); cannot pin the install",
                self.url(file)
            )));
        }
        Ok(m.commit)
    }

    /// Fetches a whole file (size checked), retrying with backoff.
    pub fn fetch(&self, file: &str) -> Result<Vec<u8>> {
        let size = self.size(file)?;
        if size == 0 {
            return Ok(Vec::new());
        }
        self.fetch_range(file, 0..size)
    }

    /// Fetches bytes `range` of `file`, retrying with backoff; the result has exactly the
    /// range's length or it is an error.
    pub fn fetch_range(&self, file: &str, range: Range<u64>) -> Result<Vec<u8>> {
        let want = (range.end - range.start) as usize;
        let mut delay = self.backoff;
        let mut last = String::new();
        for attempt in 0..self.attempts.max(1) {
            if attempt > 0 {
                std::thread::sleep(delay);
                delay *= 2;
            }
            let r = self
                .repo
                .download_file_to_bytes()
                .filename(file)
                .maybe_revision(self.revision.clone())
                .range(range.clone())
                .send();
            match r {
                Ok(b) if b.len() == want => return Ok(b.to_vec()),
                Ok(b) => last = format!("got {} bytes, expected {want}", b.len()),
                Err(e) => last = e.to_string(),
            }
            tracing::warn!(url = %self.url(file), attempt, error = %last, "range fetch failed; retrying");
        }
        Err(Error::Msg(format!(
            "fetching bytes {}..{} of {} failed after {} attempts: {last}",
            range.start,
            range.end,
            self.url(file),
            self.attempts.max(1)
        )))
    }
}
