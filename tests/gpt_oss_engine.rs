//! gpt-oss through the front door (`Engine::open` picks the family from config.json): a
//! session's greedy generation equals the model's own forward loop; speculative decoding
//! (verify passes, keeping a prefix truncates the key/value caches) and the prompt cache change
//! no token; a chat turn renders harmony and splits the reply into reasoning and content on
//! token ids; the OpenAI server answers concurrent requests on gpt-oss exactly as each alone.

#[path = "server_util/client.rs"]
#[allow(dead_code)]
mod client;
mod common;

use std::sync::atomic::AtomicBool;

use deltafin::chat::{ChatOptions, Message};
use deltafin::engine::prompt_cache::PromptCacheOptions;
use deltafin::engine::EngineOptions;
use deltafin::experts::TieredOptions;
use deltafin::models::gpt_oss::fixture::{write_gpt_oss, GptOssShape};
use deltafin::models::gpt_oss::GptOssModel;
use deltafin::runtime::generate::{SpecMode, Speculation};
use deltafin::runtime::load::LoadOptions;
use deltafin::{Engine, GenerateOptions};
use serde_json::{json, Value};

/// The tiny shape with a 1,024-position context (its tokenizer spends hundreds of ids on
/// harmony's system block and a tools section).
fn tiny(seed: u64) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let shape = GptOssShape {
        original_context: 256,
        ..GptOssShape::tiny()
    };
    write_gpt_oss(d.path(), &shape, seed, 2).unwrap();
    d
}

fn engine(root: &std::path::Path) -> Engine {
    Engine::open(root, &EngineOptions::default()).unwrap()
}

fn greedy(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// A prompt that repeats itself, so the n-gram drafter has proposals to verify.
fn prompt() -> Vec<u32> {
    let unit: Vec<u32> = (0..12u32).map(|i| (i * 37 + 11) % 480).collect();
    unit.iter().chain(&unit).chain(&unit).copied().collect()
}

/// The model's own loop: feed the prompt, then each greedy token.
fn reference(root: &std::path::Path, ids: &[u32], n: usize) -> Vec<u32> {
    let m = GptOssModel::open(root, &TieredOptions::default()).unwrap();
    let mut s = m.new_state();
    let mut l = m.forward(ids, &mut s).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let id = greedy(&l);
        out.push(id);
        l = m.forward(&[id], &mut s).unwrap();
    }
    out
}

fn opts(n: usize, spec: Speculation) -> GenerateOptions {
    GenerateOptions {
        max_new: n,
        stop_ids: Vec::new(),
        speculation: spec,
    }
}

/// One chat turn whose reply is `script` (then `end`), whatever the logits.
fn scripted_turn(
    e: &Engine,
    s: &mut deltafin::Session<'_>,
    msgs: &[Message],
    script: &[u32],
    end: u32,
) -> deltafin::ChatTurn {
    let o = GenerateOptions {
        max_new: 64,
        stop_ids: e.stop_ids(),
        speculation: Speculation::OFF,
    };
    let mut it = script.iter().copied();
    let no = AtomicBool::new(false);
    s.chat_turn(
        msgs,
        &o,
        &no,
        &mut |_l: &[f32]| it.next().unwrap_or(end),
        |_| {},
    )
    .unwrap()
}

#[test]
fn session_speculation_and_prompt_cache_match_the_models_loop() {
    let d = tiny(5);
    let mut e = engine(d.path());
    assert_eq!(e.chat_format().name(), "harmony");
    let want = reference(d.path(), &prompt(), 48);
    let no = AtomicBool::new(false);
    let run = |e: &Engine, spec| {
        let mut s = e.session(ChatOptions::default());
        s.generate(&prompt(), &opts(48, spec), &no, &mut greedy, |_| {})
            .unwrap()
    };
    let plain = run(&e, Speculation::OFF);
    assert_eq!(plain.generated_ids, want, "session vs the model's own loop");
    let ngram = Speculation {
        mode: SpecMode::Ngram,
        depth: 8,
    };
    let spec = run(&e, ngram);
    assert_eq!(spec.generated_ids, want, "speculation changed a token");
    // The random model's own replies seldom repeat, so drive the drafter with a chooser that
    // mostly repeats the prompt (every 5th pick is the model's greedy token: a rejected draft):
    // every logits row it is shown must be the one decoding without speculation shows.
    let unit = prompt()[..12].to_vec();
    let scripted = |spec| {
        let mut s = e.session(ChatOptions::default());
        let (mut seen, mut k) = (Vec::new(), 0usize);
        let g = s
            .generate(
                &prompt(),
                &opts(40, spec),
                &no,
                &mut |l: &[f32]| {
                    seen.push(l.to_vec());
                    k += 1;
                    if k % 5 == 0 {
                        greedy(l)
                    } else {
                        unit[k % 12]
                    }
                },
                |_| {},
            )
            .unwrap();
        (g, seen)
    };
    let (g0, rows0) = scripted(Speculation::OFF);
    let (g1, rows1) = scripted(ngram);
    assert_eq!(g1.generated_ids, g0.generated_ids);
    assert!(
        g1.spec.drafted > 10 && g1.spec.accepted < g1.spec.drafted,
        "{:?}",
        g1.spec
    );
    for (t, (a, b)) in rows0.iter().zip(&rows1).enumerate() {
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-5,
            "token {t}: logits differ by {worst} under speculation"
        );
    }
    eprintln!(
        "scripted n-gram speculation: {} of {} drafts accepted, {} passes for {} tokens",
        g1.spec.accepted,
        g1.spec.drafted,
        g1.spec.passes,
        g1.generated_ids.len()
    );
    e.enable_prompt_cache(PromptCacheOptions {
        ram_bytes: 64 << 20,
        ..Default::default()
    })
    .unwrap();
    let first = run(&e, Speculation::OFF);
    let second = run(&e, Speculation::OFF);
    assert_eq!(first.generated_ids, want);
    assert_eq!(second.generated_ids, want, "resumed from the prompt cache");
    let st = e.prompt_cache().unwrap().stats();
    assert!(st.hits >= 1 && st.tokens_saved > 0, "{st:?}");
}

/// A verify pass keeps any prefix: the kept state continues exactly as single steps would.
#[test]
fn verify_pass_keeps_a_prefix_exactly() {
    use deltafin::runtime::model::{Forward, Model};
    let d = tiny(8);
    let e = engine(d.path());
    let m: &dyn Model = e.model();
    let p = prompt();
    for keep in [1, 3, 5] {
        let mut a = m.new_state();
        m.forward(&p[..20], &mut a).unwrap();
        let f = Forward {
            undo: true,
            ..Default::default()
        };
        let out = m.run(&p[20..25], &mut a, &f).unwrap().unwrap();
        m.keep(out.rollback.unwrap(), &mut a, keep).unwrap();
        assert_eq!(a.pos, 20 + keep);
        let mut b = m.new_state();
        m.forward(&p[..20 + keep], &mut b).unwrap();
        let la = m
            .forward(&p[30..33], &mut a)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let lb = m
            .forward(&p[30..33], &mut b)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let worst = la
            .iter()
            .zip(&lb)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        // Same rows; only the dense kernel's row blocking may differ between pass shapes.
        assert!(worst <= 1e-5, "keep {keep}: {worst}");
    }
}

#[test]
fn chat_turns_render_harmony_and_split_on_ids() {
    let d = tiny(6);
    let e = engine(d.path());
    let tok = e.tokenizer();
    let id = |s: &str| tok.special_id(s).unwrap();
    let (start, channel, message, end, ret) = (
        id("<|start|>"),
        id("<|channel|>"),
        id("<|message|>"),
        id("<|end|>"),
        id("<|return|>"),
    );
    // A scripted reply in harmony's form: analysis, then final, then <|return|>.
    let mut script = vec![channel];
    script.extend(tok.encode_ordinary("analysis"));
    script.push(message);
    script.extend(tok.encode_ordinary("think about it"));
    script.extend([end, start]);
    script.extend(tok.encode_ordinary("assistant"));
    script.push(channel);
    script.extend(tok.encode_ordinary("final"));
    script.push(message);
    script.extend(tok.encode_ordinary("the answer"));
    script.push(ret);
    let mut s = e.session(ChatOptions::default());
    let t = scripted_turn(
        &e,
        &mut s,
        &[Message::new("user", "What is 2+2?")],
        &script,
        ret,
    );
    assert_eq!(t.generation.generated_ids, script);
    assert_eq!(t.reasoning, "think about it");
    assert_eq!(t.content, "the answer");
    let prompt = tok.decode(&t.generation.prompt_ids);
    assert!(
        prompt.contains("<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant"),
        "{prompt}"
    );
    // The second turn re-renders the history: the first reply as a final-channel message, its
    // reasoning dropped (the published template).
    let t2 = scripted_turn(
        &e,
        &mut s,
        &[Message::new("user", "And 3+3?")],
        &script,
        ret,
    );
    let p2 = tok.decode(&t2.generation.prompt_ids);
    assert!(
        p2.contains("<|start|>assistant<|channel|>final<|message|>the answer<|end|><|start|>user<|message|>And 3+3?"),
        "{p2}"
    );
    assert!(!p2.contains("think about it"), "{p2}");
    assert_eq!(s.history().len(), 4);
}

#[test]
fn server_answers_concurrent_requests_as_each_alone() {
    let d = tiny(7);
    let mut e = Engine::open(
        d.path(),
        &EngineOptions {
            load: LoadOptions {
                max_batch: None,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    e.model_mut().set_context_limit(1024);
    let cfg = deltafin::server::ServerConfig {
        max_batch: 4,
        ..Default::default()
    };
    let (addr, _st) = client::start_engine(e, cfg);
    let body = |i: usize| {
        json!({"model": "deltafin-gpt-oss", "prompt": format!("request {i} {}", "word ".repeat(3 * i)),
               "max_tokens": 12, "temperature": 0}).to_string()
    };
    let text = |b: &str| {
        let v: Value = serde_json::from_str(b).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let alone: Vec<String> = (0..4)
        .map(|i| {
            let (code, _, b) = client::http(addr, "POST", "/v1/completions", &body(i));
            assert_eq!(code, 200, "{b}");
            text(&b)
        })
        .collect();
    let together: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let b = body(i);
                sc.spawn(move || client::http(addr, "POST", "/v1/completions", &b))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                let (code, _, b) = h.join().unwrap();
                assert_eq!(code, 200, "{b}");
                text(&b)
            })
            .collect()
    });
    assert_eq!(together, alone);
    // A chat request renders harmony, with tools too; forcing a call is refused by name (not
    // rendered wrongly).
    let chat = json!({"model": "deltafin-gpt-oss", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 8, "temperature": 0});
    let (code, _, b) = client::http(addr, "POST", "/v1/chat/completions", &chat.to_string());
    assert_eq!(code, 200, "{b}");
    let mut tools = chat.clone();
    tools["tools"] =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let (code, _, b) = client::http(addr, "POST", "/v1/chat/completions", &tools.to_string());
    assert_eq!(code, 200, "{b}");
    tools["tool_choice"] = json!("required");
    let (code, _, b) = client::http(addr, "POST", "/v1/chat/completions", &tools.to_string());
    assert_eq!(code, 400, "{b}");
    assert!(b.contains("harmony"), "{b}");
}

/// A reply that calls a declared function (harmony's commentary channel addressed
/// `to=functions.NAME`, ended by `<|call|>`) comes back as a tool call; the next turn renders the
/// call and the tool's result as the template does.
#[test]
fn a_tool_call_round_trip_in_harmony() {
    let d = tiny(9);
    let e = engine(d.path());
    let tok = e.tokenizer();
    let id = |s: &str| tok.special_id(s).unwrap();
    let mut script = vec![id("<|channel|>")];
    script.extend(tok.encode_ordinary("commentary to=functions.get_weather "));
    script.push(id("<|constrain|>"));
    script.extend(tok.encode_ordinary("json"));
    script.push(id("<|message|>"));
    script.extend(tok.encode_ordinary(r#"{"city":"Paris"}"#));
    script.push(id("<|call|>"));
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]);
    let chat = ChatOptions {
        tools: Some(tools),
        ..Default::default()
    };
    let mut s = e.session(chat);
    let user = [Message::new("user", "Weather in Paris?")];
    let t = scripted_turn(&e, &mut s, &user, &script, 0);
    assert_eq!(
        t.generation.generated_ids, script,
        "<|call|> ends the reply"
    );
    assert_eq!(t.tool_calls.len(), 1, "{t:?}");
    assert_eq!(t.tool_calls[0].name, "get_weather");
    assert_eq!(t.tool_calls[0].arguments, r#"{"city":"Paris"}"#);
    assert!(t.content.is_empty() && t.reasoning.is_empty(), "{t:?}");
    let prompt = tok.decode(&t.generation.prompt_ids);
    assert!(
        prompt.contains("type get_weather = (_: {\ncity: string,\n}) => any;"),
        "{prompt}"
    );
    let mut result = Message::new("tool", "18 C, cloudy");
    result.tool_call_id = Some(t.tool_calls[0].id.clone());
    result.tool = Some("get_weather".into());
    let t2 = scripted_turn(&e, &mut s, &[result], &[], id("<|return|>"));
    let p2 = tok.decode(&t2.generation.prompt_ids);
    assert!(
        p2.contains(r#"<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"Paris"}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>18 C, cloudy<|end|><|start|>assistant"#),
        "{p2}"
    );
}

/// A prefill reports each layer of each pass (what the progress bar reads); a single step
/// reports none.
#[test]
fn a_prefill_reports_each_layer() {
    use deltafin::runtime::observe::{Event, Observer};
    use std::sync::{Arc, Mutex};
    #[derive(Default)]
    struct Steps(Mutex<Vec<f64>>);
    impl Observer for Steps {
        fn on(&self, _layer: usize, e: &Event<'_>) {
            if let Event::Prefill(p) = e {
                self.0.lock().unwrap().push(p.fraction());
            }
        }
    }
    let d = tiny(10);
    let mut e = engine(d.path());
    let steps = Arc::new(Steps::default());
    e.model_mut().observe(steps.clone());
    let m = e.model();
    let mut s = m.new_state();
    m.forward(&prompt()[..20], &mut s).unwrap();
    let got = steps.0.lock().unwrap().clone();
    assert_eq!(got, vec![0.25, 0.5, 0.75, 1.0], "4 layers, one pass");
    m.forward(&[3], &mut s).unwrap();
    assert_eq!(
        steps.0.lock().unwrap().len(),
        4,
        "a decode step is no prefill"
    );
}
