//! Our tokenizer loaded with OpenAI's cl100k_base and o200k_base ranks (shipped by tiktoken-rs)
//! and their split patterns gives exactly tiktoken-rs's ids on a large varied corpus.

#[path = "common/runner.rs"]
mod runner;

use deltafin::checkpoint::rng::Rng;
use deltafin::tokenizer::Tokenizer;

const CL100K: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const O200K: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);

fn ranks_of(bpe: &tiktoken_rs::CoreBPE, n: u32) -> Vec<Vec<u8>> {
    bpe._decode_native_and_split((0..n).collect()).collect()
}

fn corpus() -> Vec<String> {
    let mut v: Vec<String> = [
        "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{:?}\", x);\n}\n",
        "def f(a, b):\n\treturn a**2 + b  # comment\n\n\n",
        "北京是中国的首都。東京は日本の首都です。서울은 한국의 수도입니다.",
        "Emoji: 🙂🙃👩‍👩‍👧‍👦 🇫🇷 — done…",
        "   \n\n\t\t  \r\n   trailing spaces    ",
        "Numbers 1234567890 3.14159265358979 1,000,000 0x1F 2026-11-30",
        "<|endoftext|> <|open|> [BOS] <|im_start|>user<|im_end|>",
        "I'm sure they'll say it's FINE, don't you think? HE'S HERE. We'VE seen",
        "ÀÉÎÕÜ àéîõü ßẞ ǅ ǈ Ǳ mixed CamelCaseWords andSnake_case_words",
        "https://example.com/path/to/file.tar.gz?query=1&x=y#frag",
        "",
        "a",
        " ",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Random mixtures of the interesting character classes.
    let alphabet: Vec<char> = "aZ 09\n\t\r'’é北🙂.,;:!?-_/\\()[]{}<|>ǅ\u{301}\u{200d}ß"
        .chars()
        .collect();
    let mut rng = Rng::new(2026);
    for _ in 0..2000 {
        let n = rng.below(40) as usize;
        v.push(
            (0..n)
                .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
                .collect(),
        );
    }
    v.push(" ".repeat(30_000) + "x" + &"9".repeat(1000));
    v
}

fn check(bpe: tiktoken_rs::CoreBPE, n: u32, pattern: &str) {
    let ours = Tokenizer::new(ranks_of(&bpe, n), vec![], pattern)
        .unwrap()
        .with_safety_split(false);
    for text in corpus() {
        let want = bpe.encode_ordinary(&text);
        let got = ours.encode_ordinary(&text);
        assert_eq!(
            got,
            want,
            "{:?}",
            &text.chars().take(80).collect::<String>()
        );
        assert_eq!(ours.decode(&got), text);
    }
}

#[test]
fn cl100k_parity() {
    check(tiktoken_rs::cl100k_base().unwrap(), 100_256, CL100K);
}

#[test]
fn o200k_parity() {
    check(tiktoken_rs::o200k_base().unwrap(), 199_998, O200K);
}

/// Runs the binary with `args` and then `dir`, asserting it succeeded.
fn deltafin(args: &[&str], dir: &std::path::Path) {
    run_bin(env!("CARGO_BIN_EXE_deltafin"), args, dir)
}

fn run_bin(bin: &str, args: &[&str], dir: &std::path::Path) {
    let out = runner::command(bin).args(args).arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ours_of(dir: &std::path::Path) -> Tokenizer {
    Tokenizer::from_dir(dir).unwrap()
}

/// `deltafin export-tokenizer` writes a `tokenizer.json` that the `tokenizers` crate loads on its
/// own and that encodes like our tokenizer (ordinary text), with K3's specials at their ids.
#[test]
fn exported_tokenizer_json_encodes_the_same() {
    let dir = tempfile::tempdir().unwrap();
    deltafin::models::k3::fixture::write_nano(dir.path(), &Default::default()).unwrap();
    deltafin(&["export-tokenizer", "--model-root"], dir.path());
    let mut hf = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    // Loaded as is, `tokenizers` recognises special spellings in text (its default); ours
    // recognises them only where allowed. With that switched off the two agree on every text;
    // with it on, the specials come out at K3's ids.
    let mixed = "a <|open|> b [BOS] c";
    let with = hf.encode(mixed, false).unwrap().get_ids().to_vec();
    assert_eq!(with, ours_of(dir.path()).encode(mixed, true));
    hf.set_encode_special_tokens(true);
    let ours = Tokenizer::from_dir(dir.path()).unwrap();
    for text in corpus().iter().take(300) {
        let got = hf.encode(text.as_str(), false).unwrap().get_ids().to_vec();
        assert_eq!(got, ours.encode_ordinary(text), "{text:?}");
    }
    for s in ["[BOS]", "<|end_of_msg|>"] {
        assert_eq!(hf.token_to_id(s), ours.special_id(s), "{s}");
    }
}

/// `deltafin-k3 train-tokenizer` writes K3-format tokenizer files (ranks, then K3's specials) that
/// load as a model's tokenizer and encode the training text reversibly in far fewer tokens.
#[test]
fn train_tokenizer_writes_k3_format_files() {
    let dir = tempfile::tempdir().unwrap();
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/data/heldout/persuasion.txt");
    run_bin(
        env!("CARGO_BIN_EXE_deltafin-k3"),
        &["train-tokenizer", "--text", text, "--vocab", "600", "--out"],
        dir.path(),
    );
    let tok = ours_of(dir.path());
    assert_eq!(tok.num_ranks(), 600);
    assert_eq!(
        tok.special_id("<|end_of_msg|>").map(|i| i >= 600),
        Some(true)
    );
    let sample: String = std::fs::read_to_string(text)
        .unwrap()
        .chars()
        .take(20_000)
        .collect();
    let ids = tok.encode_ordinary(&sample);
    assert_eq!(tok.decode(&ids), sample);
    assert!(
        ids.len() * 2 < sample.len(),
        "{} tokens for {} bytes",
        ids.len(),
        sample.len()
    );
}
