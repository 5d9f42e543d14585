//! `bench prompt-cache`: replays a multi-turn agent transcript (a long system prompt, turns of
//! two clients interleaved, one turn edited and resent, then a restart and one more turn) with
//! and without the prompt cache, each mode on a freshly opened engine. Per request: time to
//! first token, prompt tokens prefilled, bytes read from storage, the cache's RAM and disk.
//! Then one K3-shape sequence state (93 layers: the KDA states and 2,000 MLA positions) is
//! saved and loaded through the state file, against the raw disk rate (a plain file of the
//! same size written with fsync, read back cold) measured in the same run, interleaved (five
//! runs: state, raw, state, raw, ...).

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use deltafin::chat::{encode_marked, render_marked, ChatOptions, Message};
use deltafin::engine::prompt_cache::{file, PromptCacheOptions};
use deltafin::models::k3::config::{AttnKind, K3Config};
use deltafin::runtime::load::CacheRam;
use deltafin::runtime::row_cache::RowCache;
use deltafin::runtime::state::SeqState;
use deltafin::runtime::state::{LayerState, Recurrent};
use deltafin::{Engine, EngineOptions, GenerateOptions, Result};

/// Settings of the prompt-cache bench.
pub struct PromptCacheBenchOptions {
    /// Tokens of the system prompt.
    pub system_tokens: usize,
    /// Turns (alternating between the two clients).
    pub turns: usize,
    /// Tokens generated per reply.
    pub reply: usize,
    /// Memory limit in bytes (default: the machine's).
    pub memory_limit: Option<u64>,
    /// Scratch directory (the cache's files, the snapshot files).
    pub scratch: std::path::PathBuf,
    /// Skip the K3-shape snapshot save/load figure.
    pub no_snapshot: bool,
}

const WORDS: [&str; 16] = [
    "the",
    "agent",
    "reads",
    "a",
    "file",
    "then",
    "writes",
    "tests",
    "for",
    "each",
    "module",
    "and",
    "checks",
    "its",
    "output",
    "carefully",
];

/// A system prompt of about `tokens` tokens.
fn system_prompt(engine: &Engine, tokens: usize) -> String {
    let mut text = String::from("You are a coding agent. Rules: ");
    let mut i = 0usize;
    while engine.tokenizer().encode_ordinary(&text).len() < tokens {
        for _ in 0..64 {
            text.push_str(WORDS[(i * 7 + i / 16) % WORDS.len()]);
            text.push(if i % 13 == 12 { '.' } else { ' ' });
            i += 1;
        }
    }
    text
}

/// The transcript's requests: `(client, messages)` in the order sent.
fn requests(system: &str, turns: usize) -> Vec<(char, Vec<Message>)> {
    let mut out = Vec::new();
    for t in 0..turns {
        let client = if t % 2 == 0 { 'A' } else { 'B' };
        let q = format!(
            "Client {client}, step {}: run the tests of module {t} and report.",
            t / 2 + 1
        );
        out.push((
            client,
            vec![Message::new("system", system), Message::new("user", &q)],
        ));
    }
    out
}

/// One mode's replay; emits one line per request and returns the engine (for the restart).
fn replay(
    engine: &Engine,
    mode: &str,
    system: &str,
    o: &PromptCacheBenchOptions,
    emit: &mut dyn FnMut(String),
) -> Result<()> {
    let chat = ChatOptions::default();
    let opts = GenerateOptions {
        max_new: o.reply,
        stop_ids: Vec::new(),
        ..Default::default()
    };
    let mut histories: [Vec<Message>; 2] = [Vec::new(), Vec::new()];
    let mut reqs: Vec<(char, String)> = requests(system, o.turns)
        .into_iter()
        .map(|(c, m)| (c, m[1].content.clone()))
        .collect();
    // A's last turn, edited and sent again.
    if let Some((_, q)) = reqs.iter().rev().find(|r| r.0 == 'A').cloned() {
        reqs.push(('E', format!("{q} (edited: only the failing ones)")));
    }
    for (k, (client, q)) in reqs.iter().enumerate() {
        let h = &mut histories[usize::from(*client == 'B')];
        if *client == 'E' {
            // Drop A's last turn (question and reply) before sending the edit.
            h.truncate(h.len().saturating_sub(2));
        }
        if h.is_empty() {
            h.push(Message::new("system", system));
        }
        h.push(Message::new("user", q));
        let reply = one_request(engine, mode, k, *client, h, &chat, &opts, emit)?;
        h.push(Message::new("assistant", &reply));
    }
    Ok(())
}

/// Sends one request; emits its line; returns the reply text.
#[allow(clippy::too_many_arguments)]
fn one_request(
    engine: &Engine,
    mode: &str,
    k: usize,
    client: char,
    messages: &[Message],
    chat: &ChatOptions,
    opts: &GenerateOptions,
    emit: &mut dyn FnMut(String),
) -> Result<String> {
    let (segs, seg_marks) = render_marked(messages, chat)?;
    let (ids, marks) = encode_marked(engine.tokenizer(), &segs, &seg_marks);
    let model = engine.model();
    let (read0, t0) = (model.bytes_read(), Instant::now());
    let mut first: Option<(f64, u64)> = None;
    let cancel = AtomicBool::new(false);
    let (g, _) = engine.generate(
        &ids,
        &marks,
        opts,
        &cancel,
        &mut |l: &[f32]| deltafin::runtime::generate::argmax(l),
        |_| {
            first.get_or_insert_with(|| {
                (t0.elapsed().as_secs_f64() * 1e3, model.bytes_read() - read0)
            });
        },
    )?;
    let (ttft, read) = first.unwrap_or((f64::NAN, 0));
    let stats = engine.prompt_cache().map(|c| c.stats()).unwrap_or_default();
    emit(
        serde_json::json!({
            "figure": "turn", "mode": mode, "request": k + 1, "client": client.to_string(),
            "prompt_tokens": ids.len(), "cached": g.cached, "prefilled": ids.len() - g.cached,
            "ttft_ms": ttft, "bytes_read_to_first_token": read,
            "cache_ram_bytes": stats.ram_bytes, "cache_disk_bytes": stats.disk_bytes,
        })
        .to_string(),
    );
    Ok(engine.tokenizer().decode(&g.generated_ids))
}

fn open(root: &Path, o: &PromptCacheBenchOptions, dir: Option<&Path>) -> Result<Engine> {
    let mut eo = EngineOptions::default();
    eo.load.memory_limit = o.memory_limit;
    eo.load.prompt_cache = if dir.is_some() {
        CacheRam::Auto
    } else {
        CacheRam::Off
    };
    let mut e = Engine::open(root, &eo)?;
    if let Some(d) = dir {
        let ram_bytes = e.model().plan().map_or(1 << 30, |p| p.prompt_cache);
        e.enable_prompt_cache(PromptCacheOptions {
            ram_bytes,
            dir: Some(d.to_path_buf()),
            ..Default::default()
        })?;
    }
    Ok(e)
}

/// Runs the bench on the model in `root`, emitting JSON lines.
pub fn prompt_cache_bench(
    root: &Path,
    o: &PromptCacheBenchOptions,
    mut emit: impl FnMut(String),
) -> Result<()> {
    let dir = o.scratch.join("prompt-cache");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&o.scratch).map_err(|e| deltafin::Error::io(&o.scratch, e))?;
    let system = {
        let e = open(root, o, None)?;
        system_prompt(&e, o.system_tokens)
    };
    for mode in ["none", "cache"] {
        let engine = open(root, o, (mode == "cache").then_some(dir.as_path()))?;
        replay(&engine, mode, &system, o, &mut emit)?;
    }
    // A restart: a new engine over the same directory; client B's next turn.
    let engine = open(root, o, Some(&dir))?;
    let msgs = vec![
        Message::new("system", &system),
        Message::new("user", "Client B, after a restart: summarise the failures."),
    ];
    let opts = GenerateOptions {
        max_new: o.reply,
        ..Default::default()
    };
    one_request(
        &engine,
        "restart",
        0,
        'B',
        &msgs,
        &ChatOptions::default(),
        &opts,
        &mut emit,
    )?;
    let _ = std::fs::remove_dir_all(&dir);
    if !o.no_snapshot {
        snapshot_figures(&o.scratch, &mut emit)?;
    }
    Ok(())
}

/// One snapshot run: bytes, save s, load s, raw write s, raw read s.
type Run = (u64, f64, f64, f64, f64);

/// A sequence state of K3's full shape holding `positions` positions (arbitrary values).
fn k3_state(positions: usize) -> Result<SeqState> {
    let cfg = K3Config::from_root(
        serde_json::from_value(deltafin::models::k3::fixture::full::k3_config(93))
            .map_err(|e| deltafin::Error::Msg(e.to_string()))?,
    )?;
    let t = cfg.text();
    let la = &t.linear_attn_config;
    let p = la.num_heads * la.head_dim;
    let conv = 3 * la.short_conv_kernel_size.saturating_sub(1) * p;
    let s = la.num_heads * la.head_dim * la.head_dim;
    let width = t.kv_lora_rank + t.qk_rope_head_dim;
    let fill = |n: usize, k: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 31 + k * 7) % 1000) as f32 * 1e-3)
            .collect()
    };
    let layers = cfg
        .schedule
        .iter()
        .enumerate()
        .map(|(l, k)| match k.attn {
            AttnKind::Kda => LayerState::Recurrent(Recurrent {
                buffers: vec![
                    std::sync::Arc::new(fill(conv, l)),
                    std::sync::Arc::new(fill(s, l + 1)),
                ],
            }),
            AttnKind::Mla => {
                let mut cache = RowCache::new(width, positions.max(1));
                cache.append(&fill(positions * width, l));
                LayerState::Rows(cache)
            }
        })
        .collect();
    Ok(SeqState {
        pos: positions,
        layers,
    })
}

/// An I/O error naming `p`.
fn io(p: &Path) -> impl Fn(std::io::Error) -> deltafin::Error + '_ {
    move |e| deltafin::Error::io(p, e)
}

/// Removes the previous run's files and syncs, so a timed write neither replaces a file nor
/// waits for the freeing of an old one's blocks (on a filesystem mounted with `discard`, as
/// this machine's, a journal commit that frees 575 MB trims it first: seconds).
fn settle(paths: &[&Path]) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
    // SAFETY: no arguments, no preconditions.
    unsafe { libc::sync() };
}

/// Drops a file's pages from the page cache, so the next read comes from the disk.
fn drop_cached(path: &Path) -> Result<()> {
    deltafin::experts::drop_from_page_cache_all(path)
}

/// Saving and loading one K3-shape state (median, min and max of 5, each next to its raw
/// figure) against the raw rate of a plain file of
/// the same size, written with fsync and read back cold, in the same run.
fn snapshot_figures(scratch: &Path, emit: &mut dyn FnMut(String)) -> Result<()> {
    let state = k3_state(2000)?;
    let template = {
        let mut t = state.clone();
        for l in &mut t.layers {
            if let LayerState::Rows(c) = l {
                c.truncate(0);
            }
        }
        t.pos = 0;
        t
    };
    let ids: Vec<u32> = (0..2000).collect();
    let (state_path, raw_path) = (scratch.join("k3-state.dfstate"), scratch.join("raw.bin"));
    let mut rows = Vec::new();
    for _ in 0..5 {
        settle(&[&state_path, &raw_path]);
        let t = Instant::now();
        let bytes = file::write(
            &state_path,
            "bench",
            &ids,
            &state,
            None,
            serde_json::Value::Null,
        )?;
        let save = t.elapsed().as_secs_f64();
        drop_cached(&state_path)?;
        let t = Instant::now();
        let loaded = file::read(&state_path, "bench", &template)?;
        let load = t.elapsed().as_secs_f64();
        drop(loaded);
        let buf = vec![7u8; bytes as usize];
        settle(&[&raw_path]);
        let t = Instant::now();
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&raw_path).map_err(io(&raw_path))?;
            f.write_all(&buf).map_err(io(&raw_path))?;
            f.sync_all().map_err(io(&raw_path))?;
        }
        let raw_write = t.elapsed().as_secs_f64();
        drop_cached(&raw_path)?;
        let t = Instant::now();
        // The loader's pattern without its work: 4 MiB reads into one buffer of the file's size.
        let mut back = vec![0u8; bytes as usize];
        {
            use std::io::Read;
            let mut f = std::fs::File::open(&raw_path).map_err(io(&raw_path))?;
            for chunk in back.chunks_mut(4 << 20) {
                f.read_exact(chunk).map_err(io(&raw_path))?;
            }
        }
        let raw_read = t.elapsed().as_secs_f64();
        drop(back);
        rows.push((bytes, save, load, raw_write, raw_read));
    }
    let _ = std::fs::remove_file(&state_path);
    let _ = std::fs::remove_file(&raw_path);
    // Median [min, max] over the runs.
    let stat = |f: &dyn Fn(&Run) -> f64| {
        let mut v: Vec<f64> = rows.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        [v[v.len() / 2], v[0], v[v.len() - 1]]
    };
    let bytes = rows[0].0 as f64;
    emit(
        serde_json::json!({
            "figure": "k3_snapshot", "bytes": bytes, "runs": rows.len(),
            "save_s": stat(&|r| r.1), "load_s": stat(&|r| r.2),
            "raw_write_s": stat(&|r| r.3), "raw_read_s": stat(&|r| r.4),
            "save_gb_s": stat(&|r| bytes / r.1 / 1e9), "load_gb_s": stat(&|r| bytes / r.2 / 1e9),
            "raw_write_gb_s": stat(&|r| bytes / r.3 / 1e9),
            "raw_read_gb_s": stat(&|r| bytes / r.4 / 1e9),
            "save_vs_raw_write": stat(&|r| r.1 / r.3), "load_vs_raw_read": stat(&|r| r.2 / r.4),
        })
        .to_string(),
    );
    Ok(())
}
