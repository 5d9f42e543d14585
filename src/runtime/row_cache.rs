//! `RowCache`: one layer's per-sequence cache of fixed-width rows, one per position (K3's MLA
//! latent rows, gpt-oss's keys and values; the model decides the row's layout). Grown in place
//! (capacity doubles, never past the context limit: the memory plan's charge) and shared
//! copy-on-write, so a snapshot is a clone of an `Arc` and appending copies only after a
//! snapshot. Owns the buffer; must not touch attention arithmetic.

use std::sync::Arc;

/// A per-sequence row cache.
#[derive(Debug, Clone)]
pub struct RowCache {
    rows: Arc<Vec<f32>>,
    width: usize,
    limit: usize,
}

impl RowCache {
    /// An empty cache of `width`-float rows holding at most `limit` positions.
    pub fn new(width: usize, limit: usize) -> Self {
        RowCache {
            rows: Arc::new(Vec::new()),
            width,
            limit: limit.max(1),
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.rows.len() / self.width.max(1)
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Floats per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// All rows, `[len, width]` row-major.
    pub fn rows(&self) -> &[f32] {
        &self.rows
    }

    /// Appends `rows` (`[n, width]`); copies the cache only when a snapshot shares it.
    pub fn append(&mut self, rows: &[f32]) {
        let v = Arc::make_mut(&mut self.rows);
        let need = v.len() + rows.len();
        if need > v.capacity() {
            // Double, but never reserve past the context limit (the memory plan's charge).
            let target = (2 * v.capacity())
                .max(need)
                .min(self.limit.saturating_mul(self.width).max(need));
            v.reserve_exact(target - v.len());
        }
        v.extend_from_slice(rows);
    }

    /// Keeps the first `len` positions (a verify pass's rollback); the capacity stays.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len() {
            Arc::make_mut(&mut self.rows).truncate(len * self.width);
        }
    }

    /// Identifies the shared buffer (equal for snapshots that share it).
    pub fn buffer_id(&self) -> usize {
        Arc::as_ptr(&self.rows) as usize
    }

    /// Bytes reserved.
    pub fn capacity_bytes(&self) -> usize {
        self.rows.capacity() * 4
    }
}
