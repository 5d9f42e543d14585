//! Read-ahead for store layers mapped for one pass (`SpineOptions::mapped`, a memory budget
//! below one layer). A mapped layer is otherwise read by the page faults of the compute
//! threads, a few hundred KB at a time, in file order, which is not the order the model uses
//! its tensors in (the store is sorted by name: a layer's MLP lies before its attention). So
//! the first pass over each layer records the order its tensors are asked for, and every
//! later pass asks the kernel (`POSIX_FADV_WILLNEED`, from one `spine-readahead` thread, so
//! the compute threads never wait on submitting it) for the tensors that follow the one in
//! use, up to the layer's largest tensor in bytes: the amount the memory plan charges a
//! mapped layer. Owns that thread and the learned orders; reads no tensor data itself.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use super::layer::Entry;

/// How much one advice call covers. Linux cuts a `WILLNEED` to the device's read-ahead window
/// (`max(io_pages, ra_pages)`: 8 MB on the benchmark disk, 128 KB–1.25 MB on common defaults),
/// so a 16 MB call was half read; 512 KB steps stay under common windows, and a layer that is
/// dropped stops its requests soon.
const CHUNK: u64 = 512 << 10;

/// One byte range of a layer file to bring into the page cache.
struct Job {
    file: Arc<File>,
    offset: u64,
    len: u64,
    /// Cleared when the layer is dropped: what is still queued for it is skipped.
    alive: Arc<AtomicBool>,
}

/// The spine's read-ahead: its thread's queue, the use order learned for each layer, and the
/// bytes queued for it.
pub(super) struct Readahead {
    tx: Sender<Job>,
    orders: Mutex<HashMap<usize, Arc<[usize]>>>,
    queued: AtomicU64,
}

impl Readahead {
    /// Starts the read-ahead thread; `None` if it cannot be started (layers are then read by
    /// their page faults alone).
    pub(super) fn start() -> Option<Arc<Readahead>> {
        let (ra, rx) = Self::unstarted();
        std::thread::Builder::new()
            .name("spine-readahead".into())
            .spawn(move || serve(rx, will_need))
            .ok()?;
        Some(ra)
    }

    fn unstarted() -> (Arc<Readahead>, Receiver<Job>) {
        let (tx, rx) = channel();
        let ra = Readahead {
            tx,
            orders: Mutex::default(),
            queued: AtomicU64::new(0),
        };
        (Arc::new(ra), rx)
    }

    /// Bytes queued to be read ahead so far (a layer dropped before its turn skips the rest).
    pub(super) fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    /// The read-ahead of layer `l`, mapped from `path` with tensors `entries`: it learns the use
    /// order on the first pass and follows it on later ones. `None` if the file cannot be
    /// opened again (the mapping still serves).
    pub(super) fn attach(
        self: &Arc<Self>,
        l: usize,
        path: &Path,
        entries: &[Entry],
    ) -> Option<LayerAhead> {
        let file = Arc::new(File::open(path).ok()?);
        let spans = entries
            .iter()
            .map(|e| (e.offset as u64, e.len as u64))
            .collect::<Vec<_>>();
        let known = self.orders.lock().ok()?.get(&l).cloned();
        let state = match known {
            Some(order) => {
                let mut pos_of = vec![usize::MAX; spans.len()];
                for (p, &i) in order.iter().enumerate() {
                    if let Some(slot) = pos_of.get_mut(i) {
                        *slot = p;
                    }
                }
                let lead = spans.iter().map(|s| s.1).max().unwrap_or(0);
                State::Following {
                    order,
                    pos_of,
                    cur: 0,
                    sent: 0,
                    lead,
                    extra: Vec::new(),
                }
            }
            None => State::Learning {
                seen: Vec::new(),
                mask: vec![false; spans.len()],
            },
        };
        let ahead = LayerAhead {
            ra: self.clone(),
            layer: l,
            file,
            spans,
            alive: Arc::new(AtomicBool::new(true)),
            state: Mutex::new(state),
        };
        // The layer's first tensors are wanted at once.
        ahead.pump();
        Some(ahead)
    }
}

/// `pos_of` for a tensor used outside the learned order (`usize::MAX`: not yet seen).
const EXTRA: usize = usize::MAX - 1;

enum State {
    /// First pass: the tensors in the order they are first asked for.
    Learning { seen: Vec<usize>, mask: Vec<bool> },
    /// Later passes: `order[..cur]` has been reached, `order[..sent]` asked for; `extra`:
    /// tensors used that the learned order lacks (its first pass stopped early).
    Following {
        order: Arc<[usize]>,
        pos_of: Vec<usize>,
        cur: usize,
        sent: usize,
        lead: u64,
        extra: Vec<usize>,
    },
}

/// The read-ahead of one mapped layer for one pass; stops asking when dropped.
pub(super) struct LayerAhead {
    ra: Arc<Readahead>,
    layer: usize,
    file: Arc<File>,
    /// Each tensor's `(offset, length)` in the file, by its index in the layout.
    spans: Vec<(u64, u64)>,
    alive: Arc<AtomicBool>,
    state: Mutex<State>,
}

impl LayerAhead {
    /// Tensor `idx` (its index in the layout) is about to be used.
    pub(super) fn touch(&self, idx: usize) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        match &mut *s {
            State::Learning { seen, mask } => {
                if let Some(m) = mask.get_mut(idx).filter(|m| !**m) {
                    *m = true;
                    seen.push(idx);
                }
            }
            State::Following {
                pos_of,
                cur,
                sent,
                extra,
                ..
            } => {
                let Some(&p) = pos_of.get(idx) else {
                    return;
                };
                if p >= EXTRA {
                    if p == usize::MAX {
                        pos_of[idx] = EXTRA;
                        extra.push(idx);
                    }
                    return;
                }
                *cur = (*cur).max(p + 1);
                // The tensor in use is being faulted in already.
                *sent = (*sent).max(*cur);
                drop(s);
                self.pump();
            }
        }
    }

    /// Asks for the tensors after the one in use while they fit in `lead` bytes ahead (at
    /// least one).
    fn pump(&self) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        let State::Following {
            order,
            cur,
            sent,
            lead,
            ..
        } = &mut *s
        else {
            return;
        };
        let len = |i: usize| self.spans.get(i).map_or(0, |s| s.1);
        let mut ahead: u64 = order[*cur..*sent].iter().map(|&i| len(i)).sum();
        while *sent < order.len() {
            let i = order[*sent];
            if ahead > 0 && ahead + len(i) > *lead {
                break;
            }
            if let Some(&(offset, n)) = self.spans.get(i) {
                let job = Job {
                    file: self.file.clone(),
                    offset,
                    len: n,
                    alive: self.alive.clone(),
                };
                if self.ra.tx.send(job).is_err() {
                    return;
                }
                ahead += n;
                self.ra.queued.fetch_add(n, Ordering::Relaxed);
            }
            *sent += 1;
        }
    }
}

impl Drop for LayerAhead {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Relaxed);
        let Ok(s) = self.state.get_mut() else {
            return;
        };
        let learned: Option<Arc<[usize]>> = match s {
            State::Learning { seen, .. } if !seen.is_empty() => Some(std::mem::take(seen).into()),
            State::Following { order, extra, .. } if !extra.is_empty() => {
                Some(order.iter().chain(extra.iter()).copied().collect())
            }
            _ => None,
        };
        if let (Some(order), Ok(mut o)) = (learned, self.ra.orders.lock()) {
            o.insert(self.layer, order);
        }
    }
}

/// The read-ahead thread: advises each queued range, in chunks, while its layer is alive.
fn serve(rx: Receiver<Job>, advise: impl Fn(&File, u64, u64)) {
    for job in rx {
        let end = job.offset + job.len;
        let mut at = job.offset;
        while at < end && job.alive.load(Ordering::Relaxed) {
            let n = CHUNK.min(end - at);
            advise(&job.file, at, n);
            at += n;
        }
    }
}

#[cfg(target_os = "linux")]
fn will_need(f: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: an advice on a file descriptor we hold open; it reads nothing into our memory.
    unsafe {
        libc::posix_fadvise(
            f.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_WILLNEED,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn will_need(_: &File, _: u64, _: u64) {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Dtype;

    fn entries(lens: &[usize]) -> Vec<Entry> {
        let mut off = 4096;
        lens.iter()
            .enumerate()
            .map(|(i, &len)| {
                let e = Entry {
                    name: format!("t{i}"),
                    dtype: Dtype::BF16,
                    shape: vec![len / 2],
                    offset: off,
                    len,
                    checksum: 0,
                };
                off += len;
                e
            })
            .collect()
    }

    /// The first pass learns the use order and asks for nothing; a later pass asks for the
    /// tensors after the one in use, in that order, about one largest tensor ahead.
    #[test]
    fn later_passes_ask_ahead_in_the_learned_order() {
        let (ra, rx) = Readahead::unstarted();
        let f = tempfile::NamedTempFile::new().unwrap();
        let es = entries(&[100, 400, 100, 300, 50]);
        let asked = |rx: &Receiver<Job>| rx.try_iter().map(|j| j.offset).collect::<Vec<_>>();
        let off = |i: usize| es[i].offset as u64;
        let order = [3, 1, 0, 4, 2];
        {
            let a = ra.attach(7, f.path(), &es).unwrap();
            for i in order {
                a.touch(i);
                a.touch(i);
            }
        }
        assert!(asked(&rx).is_empty(), "the first pass asks for nothing");
        let a = ra.attach(7, f.path(), &es).unwrap();
        // At once: the first tensors that fit in the largest (400 bytes): 3 (300) alone.
        assert_eq!(asked(&rx), vec![off(3)]);
        a.touch(3);
        assert_eq!(asked(&rx), vec![off(1)], "1 (400) alone fits");
        a.touch(1);
        assert_eq!(asked(&rx), vec![off(0), off(4), off(2)]);
        a.touch(2);
        a.touch(0);
        assert!(asked(&rx).is_empty(), "nothing is asked twice");
        drop(a);
        // Another layer still learns.
        let b = ra.attach(8, f.path(), &es).unwrap();
        b.touch(0);
        assert!(asked(&rx).is_empty());
        drop(b);
        // A first pass that stopped early: the tensors it missed join the order when used.
        let c = ra.attach(8, f.path(), &es).unwrap();
        assert_eq!(asked(&rx), vec![off(0)]);
        c.touch(0);
        c.touch(2);
        drop(c);
        let _d = ra.attach(8, f.path(), &es).unwrap();
        assert_eq!(asked(&rx), vec![off(0), off(2)]);
    }

    /// The thread advises each range in steps of at most `CHUNK`, covering it exactly, and
    /// skips what is queued for a dropped layer.
    #[test]
    fn ranges_are_advised_in_steps_and_dropped_layers_skipped() {
        let f = Arc::new(tempfile::tempfile().unwrap());
        let (tx, rx) = channel();
        let live = Arc::new(AtomicBool::new(true));
        let dead = Arc::new(AtomicBool::new(false));
        let job = |offset, len, alive: &Arc<AtomicBool>| Job {
            file: f.clone(),
            offset,
            len,
            alive: alive.clone(),
        };
        tx.send(job(4096, 2 * CHUNK + 100, &live)).unwrap();
        tx.send(job(1 << 30, CHUNK, &dead)).unwrap();
        drop(tx);
        let calls = Mutex::new(Vec::new());
        serve(rx, |_, at, n| calls.lock().unwrap().push((at, n)));
        assert_eq!(
            calls.into_inner().unwrap(),
            vec![
                (4096, CHUNK),
                (4096 + CHUNK, CHUNK),
                (4096 + 2 * CHUNK, 100)
            ]
        );
    }
}
