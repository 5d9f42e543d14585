//! Malformed input never panics and never allocates beyond its size times a constant: 20,000
//! random and mutated cases for each parser of untrusted bytes (the safetensors header, the
//! spine store header, the shard index, the install manifest and its records, cache file names,
//! CLI layer ranges and server request bodies). The counting allocator measures each call's
//! peak; this binary holds one test, so nothing else allocates meanwhile.

use std::path::Path;

use deltafin::alloc_count::{peak, reset_peak, CountingAlloc};
use deltafin::checkpoint::rng::Rng;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const CASES: usize = 20_000;
/// Allowed peak: this many bytes per input byte, plus a fixed allowance.
const PER_BYTE: usize = 64;
const FIXED: usize = 256 << 10;

/// Mutations of a valid sample that reach deep into a parser: byte flips, truncations,
/// structural and digit substitutions, huge numbers spliced in, and random bytes.
fn mutate(sample: &[u8], rng: &mut Rng, i: usize) -> Vec<u8> {
    let mut b = sample.to_vec();
    let pick = |rng: &mut Rng, n: usize| rng.below(n.max(1) as u64) as usize;
    match i % 6 {
        0 => {
            for _ in 0..1 + rng.below(4) {
                let k = pick(rng, b.len());
                b[k] = rng.next_u64() as u8;
            }
        }
        1 => b.truncate(pick(rng, b.len() + 1)),
        2 => {
            let k = pick(rng, b.len());
            let s = b"0123456789-e.[]{}\",:";
            b[k] = s[pick(rng, s.len())];
        }
        3 => {
            // A number that overflows every integer type, or a huge count.
            let k = pick(rng, b.len());
            let huge: &[&[u8]] = &[
                b"99999999999",
                b"18446744073709551615",
                b"1e308",
                b"-1",
                b"4294967296",
            ];
            let h = huge[pick(rng, huge.len())];
            b.splice(k..k, h.iter().copied());
        }
        4 => {
            // Duplicate a stretch (repeated keys, nested structure).
            let a = pick(rng, b.len());
            let e = (a + pick(rng, 64)).min(b.len());
            let stretch = b[a..e].to_vec();
            b.splice(a..a, stretch);
        }
        _ => b = (0..rng.below(96)).map(|_| rng.next_u64() as u8).collect(),
    }
    b
}

/// Runs `parse` on 20,000 mutations of `sample`; returns how many it accepted.
fn fuzz(what: &str, seed: u64, sample: &[u8], mut parse: impl FnMut(&[u8]) -> bool) -> usize {
    let mut rng = Rng::new(seed);
    let mut accepted = 0;
    let mut worst = 0usize;
    for i in 0..CASES {
        let input = mutate(sample, &mut rng, i);
        let base = reset_peak();
        let ok = parse(&input);
        let used = peak().saturating_sub(base);
        worst = worst.max(used);
        assert!(
            used <= PER_BYTE * input.len() + FIXED,
            "{what}: {used} bytes allocated for a {}-byte input: {:?}",
            input.len(),
            String::from_utf8_lossy(&input)
        );
        accepted += ok as usize;
    }
    eprintln!("{what}: {accepted} of {CASES} accepted, worst peak {worst} bytes");
    accepted
}

#[test]
fn parsers_of_untrusted_bytes_never_panic_or_balloon() {
    let _ = Vec::<u8>::with_capacity(1); // the allocator counts from here
    assert!(deltafin::alloc_count::installed());
    let label = Path::new("fuzz");

    // The safetensors header of a shard.
    let entries = vec![
        (
            "a.weight".to_string(),
            deltafin::checkpoint::Dtype::BF16,
            vec![4, 8],
        ),
        ("b".to_string(), deltafin::checkpoint::Dtype::F32, vec![3]),
    ];
    let header = deltafin::checkpoint::header::build_header(&entries).unwrap();
    let file_len = header.len() as u64 + 64 + 12;
    fuzz("shard header", 1, &header, |b| {
        deltafin::checkpoint::header::parse_header_bytes(b, file_len, label).is_ok()
    });

    // The spine store header.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("layer-000.bin");
    deltafin::spine::layer::write_file(
        &p,
        &[(
            "m".to_string(),
            deltafin::checkpoint::Dtype::BF16,
            vec![3, 4],
            vec![0u8; 24],
        )],
        "0123456789abcdef0123456789abcdef",
    )
    .unwrap();
    let spine = std::fs::read(&p).unwrap();
    let json_end = 16 + u64::from_le_bytes(spine[8..16].try_into().unwrap()) as usize;
    let spine_len = spine.len();
    fuzz("spine header", 2, &spine[..json_end], |b| {
        deltafin::spine::layer::parse_header_full(b, spine_len, label).is_ok()
    });

    // The shard index (a claimed shard count of 99999999999 must not be walked).
    let index = br#"{"metadata":{"total_size":1234},"weight_map":{"a.weight":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}}"#;
    let n = fuzz("index", 3, index, |b| {
        deltafin::checkpoint::inventory::shards_from_index(b, label).is_ok()
    });
    assert!(n > 0);
    let huge = br#"{"weight_map":{"a":"model-1-of-99999999999.safetensors"}}"#;
    let base = reset_peak();
    assert!(deltafin::checkpoint::inventory::shards_from_index(huge, label).is_err());
    assert!(peak() - base < FIXED);

    // The install manifest and the records next to it.
    let manifest = br#"{"mode":"stream","repo":"moonshotai/Kimi-K3","revision":"0123456789abcdef0123456789abcdef01234567","requested":"main","fingerprint":"0123456789abcdef0123456789abcdef"}"#;
    assert!(deltafin::installed::Manifest::parse(manifest).is_some());
    fuzz("manifest", 4, manifest, |b| {
        deltafin::installed::Manifest::parse(b).is_some()
    });
    let shards = br#"{"model-00001-of-00002.safetensors":{"size":123456,"etag":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad","verified":true},"model-00002-of-00002.safetensors":{"size":99,"etag":"x"}}"#;
    assert!(deltafin::checkpoint::source::parse_hub_shards(shards).is_some());
    fuzz("shards.json", 5, shards, |b| {
        deltafin::checkpoint::source::parse_hub_shards(b).is_some()
    });
    let ids = br#"{"model-00001-of-00002.safetensors":"0123456789abcdef0123456789abcdef","model-00002-of-00002.safetensors":"fedcba9876543210fedcba9876543210"}"#;
    fuzz("source.json", 6, ids, |b| {
        deltafin::checkpoint::source::parse_ids(b, label).is_ok()
    });

    // Cache file names.
    fuzz("cache names", 7, b"L12-E345.bin", |b| {
        deltafin::experts::cache_source::parse_cache_name(&String::from_utf8_lossy(b)).is_some()
    });

    // CLI layer ranges.
    fuzz("layer ranges", 8, b"1-40,45,60-92", |b| {
        deltafin::install::parse_layers(&String::from_utf8_lossy(b), 93).is_ok()
    });

    // Server request bodies.
    let chat = br#"{"model":"kimi-k3","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_tokens":16,"temperature":0.7,"top_p":0.9,"stream":true,"seed":3,"reasoning_effort":"low"}"#;
    if let Err(e) = deltafin::server::validate::chat(chat) {
        panic!("{}", e.body());
    }
    fuzz("chat body", 9, chat, |b| {
        deltafin::server::validate::chat(b).is_ok()
    });
    let completion =
        br#"{"model":"kimi-k3","prompt":"Once upon a time","max_tokens":8,"temperature":0}"#;
    if let Err(e) = deltafin::server::completion_request::completion(completion) {
        panic!("{}", e.body());
    }
    fuzz("completion body", 10, completion, |b| {
        deltafin::server::completion_request::completion(b).is_ok()
    });
}
