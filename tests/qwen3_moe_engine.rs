//! Qwen3-MoE through every front end: the engine (a session's greedy generation equals the
//! model's own loop; n-gram speculation and the prompt cache change no token; a chat turn
//! renders ChatML and splits Qwen3's think block from the content on token ids), the OpenAI
//! server (concurrent requests answered as each alone; tools refused by name), and the binary
//! against the mock hub (`setup --stream` with experts straddling shard files fetched by range
//! requests, `run` equal to the checkpoint's, `fetch-experts`, a full `setup`).

#[path = "server_util/client.rs"]
#[allow(dead_code)]
mod client;
mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use deltafin::chat::{ChatOptions, Message};
use deltafin::engine::prompt_cache::PromptCacheOptions;
use deltafin::engine::EngineOptions;
use deltafin::hub::mock::MockHub;
use deltafin::models::qwen3_moe::fixture::{write_qwen3_moe, Qwen3MoeShape};
use deltafin::runtime::generate::{argmax, SpecMode, Speculation};
use deltafin::runtime::load::LoadOptions;
use deltafin::{Engine, GenerateOptions};
use serde_json::{json, Value};

fn fixture(seed: u64, shards: usize) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    write_qwen3_moe(d.path(), &Qwen3MoeShape::tiny(), seed, shards).unwrap();
    d
}

/// A prompt that repeats itself, so the n-gram drafter has proposals to verify.
fn prompt() -> Vec<u32> {
    let unit: Vec<u32> = (0..12u32).map(|i| (i * 37 + 11) % 900).collect();
    unit.repeat(3)
}

fn generate(e: &Engine, n: usize, spec: Speculation) -> Vec<u32> {
    let o = GenerateOptions {
        max_new: n,
        stop_ids: Vec::new(),
        speculation: spec,
    };
    let mut s = e.session(ChatOptions::default());
    let no = AtomicBool::new(false);
    s.generate(&prompt(), &o, &no, &mut |l: &[f32]| argmax(l), |_| {})
        .unwrap()
        .generated_ids
}

#[test]
fn engine_speculation_prompt_cache_and_chatml_turns() {
    let d = fixture(3, 3);
    let mut e = Engine::open(d.path(), &EngineOptions::default()).unwrap();
    assert_eq!(e.chat_format().name(), "chatml");
    // The model's own loop.
    let m = e.model();
    let mut s = m.new_state();
    let mut l = m
        .forward(&prompt(), &mut s)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let mut want = Vec::new();
    for _ in 0..24 {
        want.push(argmax(&l));
        l = m.forward(&[argmax(&l)], &mut s).unwrap().to_vec1().unwrap();
    }
    assert_eq!(generate(&e, 24, Speculation::OFF), want, "session vs model");
    let ngram = Speculation {
        mode: SpecMode::Ngram,
        depth: 6,
    };
    assert_eq!(generate(&e, 24, ngram), want, "speculation changed a token");
    e.enable_prompt_cache(PromptCacheOptions {
        ram_bytes: 16 << 20,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(generate(&e, 24, Speculation::OFF), want);
    assert_eq!(generate(&e, 24, Speculation::OFF), want, "from the cache");
    assert!(e.prompt_cache().unwrap().stats().hits >= 1);

    // A scripted reply: <think>reasoning</think> content <|im_end|>.
    let tok = e.tokenizer();
    let id = |s: &str| tok.special_id(s).unwrap();
    let mut script = vec![id("<think>")];
    script.extend(tok.encode_ordinary("\nthink about it\n"));
    script.push(id("</think>"));
    script.extend(tok.encode_ordinary("\n\nthe answer"));
    script.push(id("<|im_end|>"));
    let o = GenerateOptions {
        max_new: 64,
        stop_ids: e.stop_ids(),
        speculation: Speculation::OFF,
    };
    let mut sess = e.session(ChatOptions::default());
    let mut it = script.clone().into_iter();
    let no = AtomicBool::new(false);
    let msgs = [Message::new("user", "What is 2+2?")];
    let t = sess
        .chat_turn(&msgs, &o, &no, &mut |_l: &[f32]| it.next().unwrap(), |_| {})
        .unwrap();
    assert_eq!(
        t.generation.generated_ids, script,
        "<|im_end|> ends the reply"
    );
    assert_eq!(t.reasoning.trim(), "think about it");
    assert_eq!(t.content, "the answer");
    let p = tok.decode(&t.generation.prompt_ids);
    assert_eq!(
        p,
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    // The next turn re-renders the history with the reply's content only.
    let mut it = script.into_iter();
    let t2 = sess
        .chat_turn(
            &[Message::new("user", "And 3+3?")],
            &o,
            &no,
            &mut |_l: &[f32]| it.next().unwrap(),
            |_| {},
        )
        .unwrap();
    let p2 = tok.decode(&t2.generation.prompt_ids);
    assert!(
        p2.ends_with("<|im_start|>assistant\nthe answer<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"),
        "{p2}"
    );
}

#[test]
fn server_answers_concurrent_requests_as_each_alone() {
    let d = fixture(4, 2);
    let load = LoadOptions {
        max_batch: None,
        ..Default::default()
    };
    let e = Engine::open(
        d.path(),
        &EngineOptions {
            load,
            ..Default::default()
        },
    )
    .unwrap();
    let cfg = deltafin::server::ServerConfig {
        max_batch: 4,
        ..Default::default()
    };
    let (addr, _st) = client::start_engine(e, cfg);
    let body = |i: usize| {
        json!({"model": "deltafin-qwen3-moe", "prompt": format!("request {i} {}", "word ".repeat(5 * i)),
               "max_tokens": 10, "temperature": 0})
        .to_string()
    };
    let post = |b: &str| {
        let (code, _, b) = client::http(addr, "POST", "/v1/completions", b);
        assert_eq!(code, 200, "{b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let alone: Vec<String> = (0..4).map(|i| post(&body(i))).collect();
    let together: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4).map(|i| sc.spawn(move || post(&body(i)))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    let chat = json!({"model": "deltafin-qwen3-moe", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 6, "temperature": 0});
    let (code, _, b) = client::http(addr, "POST", "/v1/chat/completions", &chat.to_string());
    assert_eq!(code, 200, "{b}");
    let mut tools = chat.clone();
    tools["tools"] =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let (code, _, b) = client::http(addr, "POST", "/v1/chat/completions", &tools.to_string());
    assert_eq!(code, 400, "{b}");
    assert!(b.contains("ChatML"), "{b}");
    // JSON masks need a format that steers replies: refused, naming this one.
    let mut json_mode = chat.clone();
    json_mode["response_format"] = json!({"type": "json_object"});
    let (code, _, b) = client::http(addr, "POST", "/v1/chat/completions", &json_mode.to_string());
    assert_eq!(code, 400, "{b}");
    assert!(
        b.contains("(chatml)") && b.contains("response_format"),
        "{b}"
    );
}

fn deltafin(hub: &MockHub, args: &[&str], root: &Path) -> Value {
    let out = common::deltafin_on_hub(hub, args, root, &[]);
    assert!(
        out.status.success(),
        "deltafin {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[test]
fn streaming_and_full_installs_from_a_hub_match_the_checkpoint() {
    const REPO: &str = "Qwen/Qwen3-MoE-tiny";
    // Cut into 11 files: experts straddle files, and a range request per part fetches them.
    let src = fixture(5, 11);
    let hub = MockHub::start(src.path(), REPO).unwrap();
    let run = [
        "run",
        "--prompt-ids",
        "12,7,301",
        "--max-new",
        "4",
        "--json",
    ];
    let want = deltafin(&hub, &run, src.path())["generated_ids"].clone();
    let dst = tempfile::tempdir().unwrap();
    let root = dst.path().join("qwen");
    deltafin(&hub, &["setup", "--stream", "--repo", REPO], &root);
    assert!(root.join("deltafin-dense/model.safetensors").is_file());
    assert_eq!(deltafin(&hub, &run, &root)["generated_ids"], want);
    deltafin(&hub, &["fetch-experts"], &root);
    let v = deltafin(&hub, &["fetch-experts", "--dry-run"], &root);
    assert_eq!(v["missing_experts"], 0, "{v}");
    let gets = hub.ranged_gets();
    assert_eq!(deltafin(&hub, &run, &root)["generated_ids"], want);
    assert_eq!(
        hub.ranged_gets(),
        gets,
        "a complete cache asks the hub for nothing"
    );
    let full = dst.path().join("qwen-full");
    deltafin(&hub, &["setup", "--full", "--repo", REPO], &full);
    assert_eq!(deltafin(&hub, &run, &full)["generated_ids"], want);
}
