//! The prompt cache (issue 30): a request resumed from an entry (in RAM or on disk, at a
//! message end, at an every-N cut, after a restart, with speculation on) gives logits
//! bit-identical and the same tokens as a fresh prefill cut at the same points; damaged files
//! are removed and never loaded, foreign ones refused; sessions save and load.

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use common::spec::same_state;
use deltafin::chat::{ChatOptions, Message};
use deltafin::engine::prompt_cache::{cut_points, PromptCache, PromptCacheOptions};
use deltafin::runtime::generate::{argmax, SpecMode, Speculation};
use deltafin::{Engine, EngineOptions, Error, GenerateOptions, Generator, Session};

fn engine(root: &Path, dir: Option<&Path>, every: usize) -> Engine {
    let mut e = Engine::open(root, &EngineOptions::default()).unwrap();
    e.enable_prompt_cache(PromptCacheOptions {
        ram_bytes: 1 << 30,
        dir: dir.map(Path::to_path_buf),
        disk_bytes: 1 << 30,
        every,
    })
    .unwrap();
    e
}

fn ids(e: &Engine, n: usize, seed: u32) -> Vec<u32> {
    let vocab = e.model().vocab_size() as u32;
    (0..n as u32)
        .map(|i| (i.wrapping_mul(7919) + 13 + seed * 101) % vocab)
        .collect()
}

/// The reference: a fresh state (no cache), the prompt run in the segments a prefill with
/// `marks` and `every` cuts it into, also cut at `resumed` (the same chunking as a prefill
/// resumed there); the last logits and the state.
fn reference(
    e: &Engine,
    ids: &[u32],
    marks: &[usize],
    every: usize,
    resumed: usize,
) -> (Vec<f32>, deltafin::runtime::state::SeqState) {
    let m = e.model();
    let mut st = m.new_state();
    let mut cuts = cut_points(ids.len(), marks, every, 0);
    if resumed > 0 && resumed < ids.len() {
        cuts.push(resumed);
        cuts.sort_unstable();
        cuts.dedup();
    }
    cuts.push(ids.len());
    let mut at = 0;
    let mut logits = None;
    for c in cuts {
        logits = Some(m.forward(&ids[at..c], &mut st).unwrap());
        at = c;
    }
    (logits.unwrap().to_vec1::<f32>().unwrap(), st)
}

fn no_cancel() -> AtomicBool {
    AtomicBool::new(false)
}

/// Resume at a message end and at an every-N cut: bit-identical logits and state.
fn resumes_exactly(root: &Path, what: &str, len: usize, every: usize) {
    let e = engine(root, None, every);
    let first = ids(&e, len, 1);
    // Message ends: the preamble, a system prompt, a turn, the last turn.
    let marks = [2, len / 3, len / 2, len - len / 10];
    let a = e.prefill(&first, &marks, &no_cancel()).unwrap().unwrap();
    assert_eq!(a.cached, 0, "{what}: an empty cache supplies nothing");
    // An edited last message: the same up to the second mark, then other tokens.
    let last_start = marks[2];
    let mut edited = first[..last_start].to_vec();
    edited.extend(ids(&e, len - last_start, 2));
    let b = e.prefill(&edited, &marks, &no_cancel()).unwrap().unwrap();
    assert_eq!(
        b.cached, last_start,
        "{what}: resumes at the last message's start"
    );
    let (want, want_st) = reference(&e, &edited, &marks, every, b.cached);
    assert!(
        b.logits == want,
        "{what}: logits resumed at a message end differ"
    );
    same_state(&b.state, &want_st, what);
    // Measured stronger: the same bits as one uncut prefill of the whole prompt, so the cache
    // never changes an answer.
    let (uncut, _) = reference(&e, &edited, &[], 0, 0);
    assert!(
        b.logits == uncut,
        "{what}: resumed logits differ from an uncut prefill"
    );
    // Sharing a prefix past an every-N cut but no message end past the first.
    if every > 0 && len > 2 * every {
        let keep = every + every / 2;
        let mut other = first[..keep].to_vec();
        other.extend(ids(&e, len - keep, 3));
        let marks = [2, len - 1];
        let c = e.prefill(&other, &marks, &no_cancel()).unwrap().unwrap();
        let want_start = cut_points(
            first.len(),
            &[2, len / 3, len / 2, len - len / 10],
            every,
            0,
        )
        .into_iter()
        .filter(|&p| p <= keep)
        .max()
        .unwrap();
        assert_eq!(
            c.cached, want_start,
            "{what}: resumes at the last cut before the divergence"
        );
        // The same chunking: the request's own cuts and the point it resumed from.
        let (want, want_st) = reference(&e, &other, &marks, every, c.cached);
        assert!(
            c.logits == want,
            "{what}: logits resumed at an every-N cut differ"
        );
        same_state(&c.state, &want_st, what);
        let (uncut, _) = reference(&e, &other, &[], 0, 0);
        assert!(
            c.logits == uncut,
            "{what}: resumed logits differ from an uncut prefill"
        );
    }
    // The same prompt again: its logits come from the entry, no prefill.
    let again = e
        .prefill(&first, &[len / 3, len / 2], &no_cancel())
        .unwrap()
        .unwrap();
    assert_eq!(
        again.cached,
        first.len(),
        "{what}: a repeated prompt is served whole"
    );
    assert!(
        again.logits == a.logits,
        "{what}: repeated prompt's logits differ"
    );
    let s = e.prompt_cache().unwrap().stats();
    assert!(s.hits >= 2 && s.tokens_saved > 0, "{what}: stats {s:?}");
}

#[test]
fn resumes_bit_identically_on_nano() {
    resumes_exactly(&common::nano(), "K3-nano", 300, 64);
}

#[test]
fn resumes_bit_identically_on_tiny() {
    resumes_exactly(&deltafin::assets::k3_tiny().unwrap(), "K3-tiny", 300, 64);
}

#[test]
fn resumes_bit_identically_on_slice() {
    let d = tempfile::tempdir().unwrap();
    deltafin::models::k3::fixture::write_slice(d.path(), 2, 16, 4).unwrap();
    resumes_exactly(d.path(), "K3-slice", 24, 8);
}

/// The shape of a restart check: a first prompt of `n` tokens with message ends `marks`, cut
/// every `every`; after the restart a prompt sharing its first `keep` tokens plus `extra` more.
struct Restart {
    n: usize,
    marks: [usize; 2],
    every: usize,
    keep: usize,
    extra: usize,
    max_new: usize,
}

/// After a restart the entries come from the directory; with speculation on the tokens are the
/// same as plain decoding from the reference prefill.
fn resumes_from_disk_after_restart(root: &Path, what: &str, r: Restart) {
    let dir = tempfile::tempdir().unwrap();
    let first;
    {
        let e = engine(root, Some(dir.path()), r.every);
        first = ids(&e, r.n, 4);
        e.prefill(&first, &r.marks, &no_cancel()).unwrap().unwrap();
        let s = e.prompt_cache().unwrap().stats();
        assert!(s.disk_entries >= 3, "{what}: written through: {s:?}");
    }
    let e = engine(root, Some(dir.path()), r.every);
    let mut next = first[..r.keep].to_vec();
    next.extend(ids(&e, r.extra, 5));
    let opts = GenerateOptions {
        max_new: r.max_new,
        stop_ids: Vec::new(),
        speculation: Speculation {
            mode: SpecMode::Ngram,
            depth: 4,
        },
    };
    let (g, _) = e
        .generate(
            &next,
            &r.marks,
            &opts,
            &no_cancel(),
            &mut |l: &[f32]| argmax(l),
            |_| {},
        )
        .unwrap();
    let want_start = cut_points(r.n, &r.marks, r.every, 0)
        .into_iter()
        .filter(|&c| c <= r.keep)
        .max()
        .unwrap();
    assert_eq!(
        g.cached, want_start,
        "{what}: the disk entry at the last cut before the divergence"
    );
    assert_eq!(e.prompt_cache().unwrap().stats().disk_hits, 1, "{what}");
    let (logits, mut st) = reference(&e, &next, &r.marks, r.every, g.cached);
    let plain = GenerateOptions {
        speculation: Speculation::OFF,
        ..opts.clone()
    };
    let want = Generator::new(e.model())
        .decode_from(
            &mut st,
            &next,
            logits,
            0.0,
            &plain,
            &no_cancel(),
            &mut |l: &[f32]| argmax(l),
            &mut *e.new_drafter(),
            |_| {},
        )
        .unwrap();
    assert_eq!(g.generated_ids, want.generated_ids, "{what}");
    assert!(g.first_step_top == want.first_step_top, "{what}");
}

#[test]
fn resumes_from_disk_after_restart_with_speculation() {
    let r = Restart {
        n: 200,
        marks: [5, 90],
        every: 64,
        keep: 150,
        extra: 60,
        max_new: 12,
    };
    resumes_from_disk_after_restart(&common::nano(), "K3-nano", r);
    let r = Restart {
        n: 200,
        marks: [5, 90],
        every: 64,
        keep: 150,
        extra: 60,
        max_new: 12,
    };
    resumes_from_disk_after_restart(&deltafin::assets::k3_tiny().unwrap(), "K3-tiny", r);
}

#[test]
fn resumes_from_disk_after_restart_on_slice() {
    let d = tempfile::tempdir().unwrap();
    deltafin::models::k3::fixture::write_slice(d.path(), 2, 16, 4).unwrap();
    let r = Restart {
        n: 24,
        marks: [2, 10],
        every: 8,
        keep: 18,
        extra: 6,
        max_new: 4,
    };
    resumes_from_disk_after_restart(d.path(), "K3-slice", r);
}

fn entry_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "dfstate"))
        .collect();
    v.sort();
    v
}

/// When the longest matching entry turns out damaged at lookup, it is removed and the next
/// intact, shorter one serves (not nothing).
#[test]
fn a_damaged_longest_entry_falls_back_to_the_next_intact_one() {
    let root = common::nano();
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&root, Some(dir.path()), 0);
    let p = ids(&e, 80, 6);
    e.prefill(&p, &[5, 40], &no_cancel()).unwrap().unwrap();
    let files = entry_files(dir.path());
    assert_eq!(files.len(), 2, "one entry at the mark, one at the end");
    let sizes: Vec<u64> = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .collect();
    // The larger file holds the longer prefix: truncate it.
    let longest = if sizes[0] > sizes[1] { 0 } else { 1 };
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&files[longest])
        .unwrap();
    f.set_len(sizes[longest] - 100).unwrap();
    let cache = PromptCache::new(
        PromptCacheOptions {
            dir: Some(dir.path().to_path_buf()),
            ..Default::default()
        },
        e.fingerprint().unwrap(),
        e.model().new_state(),
    )
    .unwrap();
    let mut longer = p.clone();
    longer.push(3);
    let r = cache
        .lookup(&longer)
        .unwrap()
        .expect("the intact shorter entry serves");
    assert_eq!(r.start, 40);
    let s = cache.stats();
    assert_eq!(s.removed_corrupt, 1, "{s:?}");
    assert_eq!(
        entry_files(dir.path()).len(),
        1,
        "the damaged file is removed"
    );
}

/// A truncated file and a flipped byte are misses and removed; a file of another checkpoint or
/// shape is refused and left alone; nothing damaged is ever loaded.
#[test]
fn damaged_and_foreign_files_are_never_loaded() {
    let root = common::nano();
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&root, Some(dir.path()), 0);
    let p = ids(&e, 80, 6);
    e.prefill(&p, &[5, 40], &no_cancel()).unwrap().unwrap();
    let files = entry_files(dir.path());
    assert_eq!(files.len(), 2, "one entry at the mark, one at the end");
    // Damage both: truncate one, flip a byte deep in the other's arrays.
    let len0 = std::fs::metadata(&files[0]).unwrap().len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0])
        .unwrap();
    f.set_len(len0 - 100).unwrap();
    let mut bytes = std::fs::read(&files[1]).unwrap();
    let n = bytes.len();
    bytes[n - 5] ^= 0x40;
    std::fs::write(&files[1], &bytes).unwrap();
    let fp = e.fingerprint().unwrap();
    let cache = PromptCache::new(
        PromptCacheOptions {
            dir: Some(dir.path().to_path_buf()),
            ..Default::default()
        },
        fp.clone(),
        e.model().new_state(),
    )
    .unwrap();
    let mut longer = p.clone();
    longer.push(3);
    assert!(
        cache.lookup(&longer).unwrap().is_none(),
        "a damaged entry must not be loaded"
    );
    assert!(cache.lookup(&p).unwrap().is_none());
    let s = cache.stats();
    assert_eq!(s.removed_corrupt, 2, "{s:?}");
    assert!(
        entry_files(dir.path()).is_empty(),
        "damaged files are removed"
    );
    // Foreign: another checkpoint's fingerprint, and another model's shape.
    let q = ids(&e, 80, 7);
    e.prefill(&q, &[], &no_cancel()).unwrap().unwrap();
    let mut longer = q.clone();
    longer.push(3);
    let other_fp = PromptCache::new(
        PromptCacheOptions {
            dir: Some(dir.path().to_path_buf()),
            ..Default::default()
        },
        "0".repeat(32),
        e.model().new_state(),
    )
    .unwrap();
    assert!(other_fp.lookup(&longer).unwrap().is_none());
    assert_eq!(other_fp.stats().refused, 1);
    let tiny = Engine::open(
        &deltafin::assets::k3_tiny().unwrap(),
        &EngineOptions::default(),
    )
    .unwrap();
    let file = entry_files(dir.path()).pop().unwrap();
    match deltafin::engine::prompt_cache::file::read(&file, &fp, &tiny.model().new_state()) {
        Err(Error::StateFile {
            corrupt: false,
            msg,
            ..
        }) => assert!(msg.contains("shape"), "{msg}"),
        Err(e) => panic!("wrong refusal: {e}"),
        Ok(_) => panic!("a state of another shape was loaded"),
    }
    assert_eq!(entry_files(dir.path()).len(), 1, "foreign files stay");
}

/// RAM is bounded: the least recently used entries go first.
#[test]
fn ram_entries_are_evicted_by_bytes() {
    let root = common::nano();
    let mut e = Engine::open(&root, &EngineOptions::default()).unwrap();
    let one = {
        let st = e.model().new_state();
        let mut seen = Default::default();
        st.unique_bytes(&mut seen)
    };
    e.enable_prompt_cache(PromptCacheOptions {
        ram_bytes: 3 * one + one / 2,
        every: 0,
        ..Default::default()
    })
    .unwrap();
    for s in 0..6 {
        let p = ids(&e, 20, 10 + s);
        e.prefill(&p, &[], &no_cancel()).unwrap().unwrap();
    }
    let st = e.prompt_cache().unwrap().stats();
    assert!(st.ram_bytes <= 3 * one + one / 2 + 4096, "{st:?}");
    assert!(st.ram_entries < 6, "{st:?}");
    // The newest is still there, the oldest gone.
    let newest = ids(&e, 20, 15);
    assert_eq!(
        e.prefill(&newest, &[], &no_cancel())
            .unwrap()
            .unwrap()
            .cached,
        20
    );
    let oldest = ids(&e, 20, 10);
    assert_eq!(
        e.prefill(&oldest, &[], &no_cancel())
            .unwrap()
            .unwrap()
            .cached,
        0
    );
}

/// A saved session continues exactly as the original would have.
#[test]
fn sessions_save_and_load() {
    let root = deltafin::assets::k3_tiny().unwrap();
    let e = Engine::open(&root, &EngineOptions::default()).unwrap();
    let opts = GenerateOptions {
        max_new: 6,
        stop_ids: vec![e.eos()],
        ..Default::default()
    };
    let chat = ChatOptions::default();
    let mut s = e.session(chat.clone());
    let turn = |s: &mut Session, q: &str| {
        s.chat_turn(
            &[Message::new("user", q)],
            &opts,
            &no_cancel(),
            &mut |l: &[f32]| argmax(l),
            |_| {},
        )
        .unwrap()
        .generation
        .generated_ids
    };
    turn(&mut s, "Hello there.");
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("a.dfsession");
    let bytes = s.save(&path).unwrap();
    assert!(bytes > 0);
    let mut loaded = Session::load(&e, chat, &path).unwrap();
    assert_eq!(loaded.tokens(), s.tokens());
    assert_eq!(loaded.history(), s.history());
    same_state(loaded.state(), s.state(), "loaded session");
    assert_eq!(turn(&mut loaded, "And then?"), turn(&mut s, "And then?"));
}
