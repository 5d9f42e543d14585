//! Tokenizer throughput on a real-size vocabulary: OpenAI's o200k_base ranks (shipped by the
//! `tiktoken-rs` dev-dependency, 199,998 ranks) loaded into our `Tokenizer` with K3's split
//! pattern, encoding 10 MB of mixed text (English, code, numbers, CJK, emoji); tiktoken-rs on
//! the same text in the same run is the reference. Also a 1 MiB single-piece input (one run of
//! letters, so the split pattern yields one piece), which must finish in under a second.
//!
//! `cargo run --release --example tokenizer_throughput [-- MB RUNS]`; prints JSON lines.

use std::time::Instant;

use deltafin::checkpoint::rng::Rng;
use deltafin::tokenizer::{Tokenizer, TIKTOKEN_PATTERN};

fn text(mb: usize) -> String {
    let words = [
        "the",
        "model",
        "streams",
        "experts",
        "from",
        "disk",
        "and",
        "keeps",
        "its",
        "spine",
        "resident",
        "Paris",
        "capital",
        "of",
        "France",
        "is",
        "mixture",
        "quantised",
        "weights",
        "fn main() {",
        "let x = vec![1, 2, 3];",
        "println!(\"{x:?}\");",
        "}",
        "3.14159",
        "2026",
        "北京是中国的首都。",
        "東京は日本の首都です。",
        "🙂",
        "—",
        "naïve",
        "I'm",
        "they'll",
        "\n",
        "\n\n",
        "    ",
        "\t",
    ];
    let mut rng = Rng::new(17);
    let mut s = String::with_capacity(mb << 20);
    while s.len() < mb << 20 {
        let w = words[rng.below(words.len() as u64) as usize];
        s.push_str(w);
        if !w.ends_with(char::is_whitespace) {
            s.push(' ');
        }
    }
    s
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (mb, runs) = (
        args.first().copied().unwrap_or(10),
        args.get(1).copied().unwrap_or(5),
    );
    let bpe = tiktoken_rs::o200k_base()?;
    let n = 199_998u32;
    let ranks: Vec<Vec<u8>> = bpe._decode_native_and_split((0..n).collect()).collect();
    let t0 = Instant::now();
    let ours = Tokenizer::new(ranks.clone(), vec![], TIKTOKEN_PATTERN)?;
    let build_s = t0.elapsed().as_secs_f64();
    // Without tiktoken's 25,000-character run split, so the 1 MiB piece stays one piece.
    let whole = Tokenizer::new(ranks, vec![], TIKTOKEN_PATTERN)?.with_safety_split(false);
    let s = text(mb);
    let bytes = s.len() as f64 / 1e6;
    let (mut ours_mbs, mut ref_mbs, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    let mut tokens = 0;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        tokens = ours.encode_ordinary(&s).len();
        let a = bytes / t.elapsed().as_secs_f64();
        let t = Instant::now();
        std::hint::black_box(bpe.encode_ordinary(&s));
        let b = bytes / t.elapsed().as_secs_f64();
        ours_mbs.push(a);
        ref_mbs.push(b);
        ratio.push(a / b);
    }
    let (m, lo, hi) = median(ours_mbs);
    let (rm, rlo, rhi) = median(ref_mbs);
    let (q, qlo, qhi) = median(ratio);
    println!(
        "{}",
        serde_json::json!({"figure": "tokenizer_mb_per_s", "mb": bytes, "tokens": tokens,
            "build_s": build_s, "ours": {"median": m, "min": lo, "max": hi},
            "tiktoken_rs": {"median": rm, "min": rlo, "max": rhi},
            "ours_over_tiktoken_rs": {"median": q, "min": qlo, "max": qhi}})
    );
    let piece: String = "abcdefghij"
        .repeat(1 << 20 >> 3)
        .chars()
        .take(1 << 20)
        .collect();
    let mut times = Vec::new();
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        std::hint::black_box(whole.encode_ordinary(&piece));
        times.push(t.elapsed().as_secs_f64());
    }
    let (m, lo, hi) = median(times);
    println!(
        "{}",
        serde_json::json!({"figure": "one_mib_single_piece_s", "median": m, "min": lo, "max": hi})
    );
    Ok(())
}
