//! Pooled buffers (expert spans, streamed spine layers): page-aligned allocations recycled through a pool, so the hot read path
//! neither maps fresh memory (page faults) nor frees it per token. `O_DIRECT`-ready.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use crate::{Error, Result};

/// Alignment of pooled buffers: a page (16 KiB on Apple Silicon, so Metal can wrap an expert
/// buffer without copying; 4 KiB elsewhere), and what `O_DIRECT` needs.
pub const ALIGN: usize = if cfg!(target_os = "macos") {
    16384
} else {
    4096
};

/// A zero-initialised, page-aligned byte buffer.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    /// Where the visible bytes start (0 but for a direct read of an unaligned file range).
    start: usize,
    len: usize,
    cap: usize,
}

// SAFETY: the buffer owns its allocation exclusively; access follows Rust borrowing rules.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access is read-only through `Deref`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `cap` bytes (rounded up to the alignment), all touched (zeroed).
    pub fn new(cap: usize) -> Result<Self> {
        let cap = cap.max(1).div_ceil(ALIGN) * ALIGN;
        let layout = Layout::from_size_align(cap, ALIGN).map_err(|e| Error::Msg(e.to_string()))?;
        // SAFETY: non-zero size and a valid power-of-two alignment.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| Error::Msg(format!("out of memory allocating {cap} bytes")))?;
        Ok(AlignedBuf {
            ptr,
            start: 0,
            len: cap,
            cap,
        })
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the visible bytes to the first `len` (at most the capacity).
    pub fn set_len(&mut self, len: usize) {
        self.set_window(0, len);
    }

    /// Sets the visible bytes to `len` bytes from `start` (clamped to the capacity).
    pub fn set_window(&mut self, start: usize, len: usize) {
        self.start = start.min(self.cap);
        self.len = len.min(self.cap - self.start);
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` owns `cap >= start + len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(self.start), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(self.start), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.cap, ALIGN),
            )
        }
    }
}

/// A pool of recycled aligned buffers.
pub struct BufPool {
    free: Mutex<Vec<AlignedBuf>>,
    max_free: usize,
}

impl BufPool {
    /// A pool keeping at most `max_free` idle buffers.
    pub fn new(max_free: usize) -> Arc<Self> {
        Arc::new(BufPool {
            free: Mutex::new(Vec::new()),
            max_free,
        })
    }

    /// A buffer of exactly `len` visible bytes (contents unspecified), recycled when possible.
    pub fn take(self: &Arc<Self>, len: usize) -> Result<PooledBuf> {
        self.take_sized(len, len)
    }

    /// `take`, but a fresh allocation gets at least `cap` bytes of capacity, so every buffer
    /// of a pool of template layers fits any layer and the pool never grows past its users.
    pub fn take_sized(self: &Arc<Self>, len: usize, cap: usize) -> Result<PooledBuf> {
        let reused = self.free.lock().ok().and_then(|mut f| {
            let i = f.iter().position(|b| b.capacity() >= len)?;
            Some(f.swap_remove(i))
        });
        let mut b = match reused {
            Some(b) => b,
            None => AlignedBuf::new(len.max(cap))?,
        };
        b.set_len(len);
        Ok(PooledBuf(Inner::Pooled(Some(b), Arc::downgrade(self))))
    }

    /// Idle buffers held.
    pub fn idle(&self) -> usize {
        self.free.lock().map(|f| f.len()).unwrap_or(0)
    }

    fn give_back(&self, b: AlignedBuf) {
        if let Ok(mut f) = self.free.lock() {
            if f.len() < self.max_free {
                f.push(b);
            }
        }
    }
}

enum Inner {
    Owned(Vec<u8>),
    Pooled(Option<AlignedBuf>, Weak<BufPool>),
    /// A private (copy-on-write) mapping of a whole file: reads share the page cache, and a
    /// write would touch only this process's copy, never the file.
    Mapped(memmap2::MmapMut),
}

/// The bytes of one expert: owned, or a pooled aligned buffer that returns to its pool when
/// dropped.
pub struct PooledBuf(Inner);

impl PooledBuf {
    /// Wraps owned bytes.
    pub fn owned(v: Vec<u8>) -> Self {
        PooledBuf(Inner::Owned(v))
    }

    /// The whole file `f` (at `path`), mapped privately and asked for at once (`WillNeed`).
    /// Sound while nobody writes the file in place; this crate publishes every file under a
    /// temporary name and renames it, so a mapping keeps the old inode's bytes.
    pub fn mapped(f: &std::fs::File, path: &std::path::Path) -> Result<Self> {
        Self::mapped_as(f, path, memmap2::Advice::WillNeed)
    }

    /// `mapped`, but read on demand front to back (`Sequential`): for a file larger than the
    /// memory budget, whose pages the kernel reads ahead and drops again as they are used.
    pub fn mapped_streaming(f: &std::fs::File, path: &std::path::Path) -> Result<Self> {
        Self::mapped_as(f, path, memmap2::Advice::Sequential)
    }

    fn mapped_as(f: &std::fs::File, path: &std::path::Path, a: memmap2::Advice) -> Result<Self> {
        // SAFETY: see `mapped`; the mapping is private, so nothing we do writes the file.
        let m =
            unsafe { memmap2::MmapOptions::new().map_copy(f) }.map_err(|e| Error::io(path, e))?;
        m.advise(a).map_err(|e| Error::io(path, e))?;
        Ok(PooledBuf(Inner::Mapped(m)))
    }
}

impl PooledBuf {
    /// For a pooled buffer: its start and its whole allocation (a multiple of `ALIGN`, covering
    /// the visible bytes), so a GPU API may wrap the memory in place.
    pub fn aligned_region(&self) -> Option<(*const u8, usize)> {
        match &self.0 {
            Inner::Pooled(Some(b), _) if b.start == 0 => Some((b.as_ptr(), b.capacity())),
            _ => None,
        }
    }

    /// For a pooled buffer: makes `len` bytes from `start` of its allocation the visible ones
    /// (a direct read lands an unaligned range `start` bytes into an aligned buffer); `false`
    /// for other buffers or a window past the allocation.
    pub fn set_window(&mut self, start: usize, len: usize) -> bool {
        match &mut self.0 {
            Inner::Pooled(Some(b), _) if start + len <= b.capacity() => {
                b.set_window(start, len);
                true
            }
            _ => false,
        }
    }
}

impl From<Vec<u8>> for PooledBuf {
    fn from(v: Vec<u8>) -> Self {
        PooledBuf::owned(v)
    }
}

impl Deref for PooledBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Inner::Owned(v) => v,
            Inner::Pooled(Some(b), _) => b,
            Inner::Pooled(None, _) => &[],
            Inner::Mapped(m) => m,
        }
    }
}

impl DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Inner::Owned(v) => v,
            Inner::Pooled(Some(b), _) => b,
            Inner::Pooled(None, _) => &mut [],
            Inner::Mapped(m) => m,
        }
    }
}

impl std::fmt::Debug for PooledBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PooledBuf({} bytes)", self.len())
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Inner::Pooled(b, pool) = &mut self.0 {
            if let (Some(b), Some(p)) = (b.take(), pool.upgrade()) {
                p.give_back(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("deltafin-buf-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn buffers_are_aligned_and_recycled() {
        let pool = BufPool::new(2);
        let a = pool.take(10_000).unwrap();
        assert_eq!(a.len(), 10_000);
        assert_eq!(a.as_ptr() as usize % ALIGN, 0);
        let (start, cap) = a.aligned_region().unwrap();
        assert_eq!((start, cap % ALIGN), (a.as_ptr(), 0));
        assert!(cap >= a.len());
        assert!(PooledBuf::owned(vec![1, 2]).aligned_region().is_none());
        let dir = tempfile_dir();
        let path = dir.join("m.bin");
        std::fs::write(&path, b"mapped bytes").unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let mut m = PooledBuf::mapped(&f, &path).unwrap();
        assert_eq!(&m[..], b"mapped bytes");
        m[0] = b'M'; // a private copy: the file keeps its bytes
        assert_eq!(std::fs::read(&path).unwrap(), b"mapped bytes");
        std::fs::remove_dir_all(&dir).ok();
        let p = a.as_ptr();
        drop(a);
        assert_eq!(pool.idle(), 1);
        let b = pool.take(5_000).unwrap();
        assert_eq!(b.as_ptr(), p, "the idle buffer is reused");
        assert_eq!(b.len(), 5_000);
        let c = pool.take(20_000).unwrap();
        drop((b, c));
        assert_eq!(pool.idle(), 2);
        let d = pool.take(1).unwrap();
        let e = pool.take(1).unwrap();
        let f = pool.take(1).unwrap();
        drop((d, e, f));
        assert_eq!(pool.idle(), 2, "at most max_free idle buffers");
        let pool = BufPool::new(1);
        let mut w = pool.take(8192).unwrap();
        let base = w.as_ptr();
        w[100] = 7;
        assert!(w.set_window(100, 50) && w.len() == 50 && w[0] == 7);
        assert!(w.aligned_region().is_none(), "a window is not page-aligned");
        assert!(!w.set_window(8000, 8192));
        drop(w);
        let again = pool.take(4096).unwrap();
        assert_eq!(
            (again.as_ptr(), again.len()),
            (base, 4096),
            "a reused buffer starts at 0"
        );
    }
}
