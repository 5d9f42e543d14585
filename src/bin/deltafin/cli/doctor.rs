//! `deltafin doctor`: what this machine and an installed model can do, and what is wrong with
//! them, each line `ok`, `warn` or `FAIL` with the fix. Exits non-zero on any `FAIL`.

use std::path::{Path, PathBuf};

use clap::Args;

use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::mxfp4::Kernel;
use deltafin::runtime::memory::{reserve, Memory};
use deltafin::spine::convert::{store_dir, SpineFormat};

/// Arguments of `doctor`.
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// Model directory to audit (without it only the host is checked).
    #[arg(long)]
    pub model_root: Option<PathBuf>,
    /// Also re-read the spine store and check every tensor's checksum (reads all of it).
    #[arg(long)]
    pub verify: bool,
}

#[derive(Default)]
struct Report {
    fails: usize,
    warns: usize,
}

impl Report {
    fn ok(&mut self, what: &str, detail: impl std::fmt::Display) {
        println!("ok    {what}: {detail}");
    }
    fn warn(&mut self, what: &str, detail: impl std::fmt::Display) {
        self.warns += 1;
        println!("warn  {what}: {detail}");
    }
    fn fail(&mut self, what: &str, detail: impl std::fmt::Display) {
        self.fails += 1;
        println!("FAIL  {what}: {detail}");
    }
}

const GB: f64 = 1e9;

fn host(r: &mut Report) {
    let k = Kernel::best();
    let line = format!(
        "{} threads, MXFP4 kernel {}{}",
        rayon::current_num_threads(),
        k.name(),
        if cfg!(feature = "metal") {
            ", Metal compiled in"
        } else {
            ""
        }
    );
    if k == Kernel::Scalar {
        r.warn(
            "cpu",
            format!("{line} (no SIMD kernel for this CPU: expect slow tokens)"),
        );
    } else {
        r.ok("cpu", line);
    }
    if deltafin::compute::device::METAL_COMPILED {
        match deltafin::compute::device::select(deltafin::compute::device::DeviceChoice::Metal) {
            Ok(_) => r.ok("metal", "device 0 opens"),
            Err(e) => r.warn("metal", e),
        }
    }
    let mem = Memory::read();
    let total = mem.effective_total();
    let (limit, source) = mem.limit();
    let detail = format!(
        "{:.1} GB usable ({:.1} GB physical{}), {:.1} GB available, limit {:.1} GB ({source}), {:.1} GB reserved for the OS",
        total as f64 / GB,
        mem.total as f64 / GB,
        mem.cgroup_limit
            .map(|l| format!(", cgroup limit {:.1} GB", l as f64 / GB))
            .unwrap_or_default(),
        mem.available as f64 / GB,
        limit as f64 / GB,
        reserve(limit) as f64 / GB
    );
    if total < 16_000_000_000 {
        r.warn(
            "memory",
            format!("{detail}: under 16 GB, K3 will stream nearly everything"),
        );
    } else {
        r.ok("memory", detail);
    }
}

/// Temporaries an interrupted writer left in the root's directories.
fn temporaries(r: &mut Report, root: &Path) {
    let dirs = [
        root.to_path_buf(),
        root.join("deltafin-meta"),
        root.join("deltafin-meta/headers"),
        store_dir(root, SpineFormat::Bf16),
        store_dir(root, SpineFormat::Int8),
        deltafin::installed::experts_dir(root),
    ];
    let left: Vec<String> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|rd| rd.flatten())
        .filter(|e| deltafin::fsio::atomic::is_temp_name(&e.file_name().to_string_lossy()))
        .map(|e| e.path().display().to_string())
        .collect();
    if left.is_empty() {
        r.ok("temporaries", "none left by interrupted writers");
    } else {
        r.warn(
            "temporaries",
            format!(
                "{} left by an interrupted writer (e.g. {}); the next setup, fetch-experts or conversion removes those of dead processes",
                left.len(),
                left[0]
            ),
        );
    }
}

fn model(r: &mut Report, root: &Path, verify: bool) {
    // A setup that started (headers being saved) but never wrote its manifest was interrupted:
    // nothing is wrong with the files so far, and setup resumes from them.
    if deltafin::installed::read_manifest(root).is_none()
        && deltafin::installed::setup_marker(root).is_file()
    {
        temporaries(r, root);
        return r.warn(
            "install",
            format!(
                "setup did not finish in {} (interrupted); run the same `deltafin setup` again to resume it",
                root.display()
            ),
        );
    }
    let family = match deltafin::models::family(root) {
        Ok(f) => f,
        Err(e) => return r.fail("config", e),
    };
    match family.summary(root) {
        Ok(line) => r.ok("config", line),
        Err(e) => return r.fail("config", e),
    }
    let inv = match Inventory::from_dir(root) {
        Ok(i) => {
            r.ok(
                "shards",
                format!("{} shards, {} tensors", i.shards.len(), i.len()),
            );
            i
        }
        Err(e) => return r.fail("shards", e),
    };
    let index = match family.expert_index(root, &inv) {
        Ok(x) => {
            r.ok("experts", format!("{} expert spans resolved", x.count()));
            Some(x)
        }
        Err(e) => {
            r.fail("experts", e);
            None
        }
    };
    for (what, check) in family.checks(root, &inv) {
        match check {
            Ok(detail) => r.ok(what, detail),
            Err(problem) => r.warn(what, problem),
        }
    }
    let opts = deltafin::runtime::load::LoadOptions::default();
    match family.plan(root, &candle::Device::Cpu, &opts) {
        Ok(p) => r.ok(
            "memory plan",
            format!(
                "{} of {} layers pinned with default settings\n{p}",
                p.pinned_count(),
                p.pinned.len()
            ),
        ),
        Err(e) => r.fail("memory plan", e),
    }
    match deltafin::installed::read_manifest(root) {
        Some(m) if m.mode == deltafin::installed::Mode::Stream => {
            match deltafin::install::missing_experts(root, None) {
                Ok(miss) => {
                    let (n, b) = miss
                        .iter()
                        .fold((0, 0u64), |(n, b), t| (n + t.1.len(), b + t.2));
                    r.ok(
                    "install",
                    format!(
                        "streaming install of {} at commit {}: {n} experts ({:.1} GB) not local yet; `deltafin fetch-experts` fetches them",
                        m.repo,
                        m.revision.as_deref().unwrap_or("main (not pinned: re-run setup)"),
                        b as f64 / GB
                    ),
                )
                }
                Err(e) => r.fail("install", e),
            }
        }
        Some(m) => r.ok(
            "install",
            format!(
                "full install of {} at commit {}",
                m.repo,
                m.revision.as_deref().unwrap_or("main (not pinned)")
            ),
        ),
        None => r.ok("install", "a plain checkpoint directory"),
    }
    temporaries(r, root);
    let fp = deltafin::checkpoint::Source::of(&inv).fingerprint();
    r.ok("source", format!("checkpoint fingerprint {fp}"));
    // A family that converts its dense tensors into a spine store (rather than mapping them).
    if let (true, Some(index)) = (family.dense_copy_bytes(1) > 0, &index) {
        for f in [SpineFormat::Int8, SpineFormat::Bf16] {
            spine_store(r, root, f, index.spans.len(), &fp, verify);
        }
    }
    if let Some(index) = &index {
        expert_cache(r, root, &inv, index);
    }
    match family.tokenizer(root) {
        Ok(t) => r.ok("tokenizer", format!("{} ranks", t.num_ranks())),
        Err(e) => r.fail("tokenizer", e),
    }
    match deltafin::fsio::fs_free(root) {
        Some(b) if b < 50_000_000_000 => r.warn(
            "disk",
            format!(
                "{:.1} GB free at {}: the expert cache and spine store need room",
                b as f64 / GB,
                root.display()
            ),
        ),
        Some(b) => r.ok("disk", format!("{:.1} GB free", b as f64 / GB)),
        None => r.warn("disk", "free space unknown"),
    }
}

/// One spine store: complete and from this checkpoint (checksums verified with `--verify`),
/// partial, stale (built from another checkpoint) or absent.
fn spine_store(r: &mut Report, root: &Path, f: SpineFormat, layers: usize, fp: &str, verify: bool) {
    use deltafin::spine::convert::{store_files, store_state, StoreState};
    let what = format!("spine {}", f.dir_name());
    let convert = if f == SpineFormat::Int8 {
        "convert-spine-int8"
    } else {
        "convert-spine"
    };
    let files: Vec<PathBuf> = store_files(&store_dir(root, f), layers);
    match store_state(root, f, layers, fp) {
        StoreState::Current if verify => {
            let pool = deltafin::fsio::BufPool::new(1);
            // Every file, the tail (lm_head) and the embedding included.
            let bad: Vec<String> = files
                .iter()
                .filter(|p| {
                    deltafin::spine::layer::read_file(p, &pool)
                        .and_then(|l| l.verify())
                        .is_err()
                })
                .map(|p| p.display().to_string())
                .collect();
            if bad.is_empty() {
                r.ok(
                    &what,
                    format!(
                        "complete, from this checkpoint; checksums of {} files verified ({layers} layers, global, embed)",
                        files.len()
                    ),
                );
            } else {
                r.fail(
                    &what,
                    format!("checksum errors in {}: re-run the conversion", bad.join(", ")),
                );
            }
        }
        StoreState::Current => r.ok(&what, "complete, from this checkpoint"),
        StoreState::Missing => r.ok(&what, "not converted (optional)"),
        StoreState::Partial { done, total } => r.warn(
            &what,
            format!(
                "{done} of {total} files; resume with `deltafin {convert} --model-root {}`",
                root.display()
            ),
        ),
        StoreState::Stale { stale, built_from } => r.warn(
            &what,
            format!(
                "{stale} file(s) were built from another checkpoint (source {}, this one is {fp}): not used; rebuild with `deltafin {convert} --model-root {}` (or re-run setup)",
                built_from.as_deref().unwrap_or("unrecorded"),
                root.display()
            ),
        ),
    }
}

/// The streaming install's expert cache: whether every cached expert was read from the shards
/// this checkpoint has now.
fn expert_cache(r: &mut Report, root: &Path, inv: &Inventory, index: &ExpertIndex) {
    let dir = deltafin::installed::experts_dir(root);
    if !dir.is_dir() {
        return;
    }
    let Ok(c) = deltafin::experts::DiskCache::new(&dir, deltafin::experts::CacheAdvice::Auto)
    else {
        return r.fail("expert cache", format!("{} is unreadable", dir.display()));
    };
    let cached = c.cached_experts();
    let ids = deltafin::checkpoint::Source::of(inv).shard_ids();
    let stale = match c.recorded_source() {
        None => cached.len(),
        Some(_) => {
            let changed: std::collections::HashSet<String> =
                c.changed_units(&ids).into_iter().collect();
            cached
                .iter()
                .filter(|(l, e)| {
                    index
                        .spans
                        .get(*l)
                        .and_then(|s| s.get(*e))
                        .and_then(|s| inv.shards.get(s.shard))
                        .is_none_or(|s| changed.contains(&s.file))
                })
                .count()
        }
    };
    if stale > 0 {
        r.warn(
            "expert cache",
            format!(
                "{stale} of {} cached experts were read from another source (a re-upload, setup at another revision, or no record): the next run removes them and fetches them again",
                cached.len()
            ),
        );
    } else {
        r.ok(
            "expert cache",
            format!(
                "{} experts, all read from this checkpoint's shards",
                cached.len()
            ),
        );
    }
}

/// Runs `deltafin doctor`.
pub fn run(a: &DoctorArgs) -> anyhow::Result<()> {
    let mut r = Report::default();
    host(&mut r);
    if let Some(root) = &a.model_root {
        model(&mut r, root, a.verify);
    }
    println!("{} failure(s), {} warning(s)", r.fails, r.warns);
    if r.fails > 0 {
        anyhow::bail!("doctor found {} failure(s)", r.fails);
    }
    Ok(())
}
