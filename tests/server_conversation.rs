//! The server's conversation state on K3-nano, over real loopback HTTP: a later turn resumes
//! from the prompt cache and answers exactly as a fresh prefill does.

#[path = "server_util/client.rs"]
mod client;
mod common;

use client::{http, start};
use deltafin::server::ServerConfig;
use serde_json::{json, Value};

fn post_to(addr: std::net::SocketAddr, body: &Value) -> Value {
    let (st, _, b) = http(addr, "POST", "/v1/chat/completions", &body.to_string());
    assert_eq!(st, 200, "{b}");
    serde_json::from_str(&b).unwrap()
}

#[test]
fn conversation_state_reuse_gives_the_same_tokens() {
    let addr = start(ServerConfig::default());
    let first = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1});
    let r1 = post_to(addr, &first);
    let p1 = r1["usage"]["prompt_tokens"].as_u64().unwrap();
    // The next turn's prompt extends the first one (an empty assistant turn renders no
    // reasoning), so its state is reused.
    let second = json!({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""},
        {"role": "user", "content": "More please"}], "max_tokens": 5});
    let reused = post_to(addr, &second);
    assert_eq!(
        reused["usage"]["prompt_tokens_details"]["cached_tokens"],
        p1
    );
    // Another conversation does not push the first one out: the same request again is served
    // whole from its entry (the prompt and its logits).
    post_to(
        addr,
        &json!({"messages": [{"role": "user", "content": "Something else"}], "max_tokens": 2}),
    );
    let again = post_to(addr, &second);
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"],
        again["usage"]["prompt_tokens"]
    );
    assert_eq!(again["choices"], reused["choices"]);
    // A server without the cache prefills everything and answers the same.
    let plain = start(ServerConfig {
        prompt_cache: false,
        ..Default::default()
    });
    let fresh = post_to(plain, &second);
    assert_eq!(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(fresh["choices"], reused["choices"]);
    assert_eq!(
        fresh["usage"]["prompt_tokens"],
        reused["usage"]["prompt_tokens"]
    );
}

/// A first turn of several tokens whose reasoning and content come back in the next request:
/// whatever is reused, the answer equals a fresh prefill's (a server without the cache); and
/// with `max_tokens` 0 (nothing is prefilled) no state is saved for the next request to reuse.
#[test]
fn conversation_reuse_after_a_multi_token_turn() {
    for max in [6usize, 0] {
        let addr = start(ServerConfig {
            max_tokens: max,
            ..Default::default()
        });
        let r1 = post_to(
            addr,
            &json!({"messages": [{"role": "user", "content": "Tell me"}]}),
        );
        assert_eq!(r1["usage"]["completion_tokens"], max as u64, "{r1}");
        let m = &r1["choices"][0]["message"];
        let second = json!({"messages": [{"role": "user", "content": "Tell me"},
            {"role": "assistant", "content": m["content"], "reasoning_content": m["reasoning_content"]},
            {"role": "user", "content": "And then?"}]});
        let reused = post_to(addr, &second);
        let cached = reused["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(cached <= reused["usage"]["prompt_tokens"].as_u64().unwrap());
        if max == 0 {
            assert_eq!(cached, 0, "nothing was prefilled, nothing may be reused");
        } else {
            assert!(cached > 0, "the first turn's entries serve the second");
        }
        let plain = start(ServerConfig {
            max_tokens: max,
            prompt_cache: false,
            ..Default::default()
        });
        let fresh = post_to(plain, &second);
        assert_eq!(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(
            fresh["choices"], reused["choices"],
            "max_tokens {max}, cached {cached}"
        );
    }
}

/// Two clients alternating (the same system prompt, their own turns) and an edited turn each
/// prefill only what their longest saved prefix lacks.
#[test]
fn alternating_clients_and_an_edited_turn_resume() {
    let addr = start(ServerConfig {
        max_tokens: 3,
        ..Default::default()
    });
    let sys = json!({"role": "system", "content": "You are terse. Answer in one line, always."});
    let ask = |history: &Vec<Value>| post_to(addr, &json!({"messages": history}));
    let cached = |r: &Value| {
        r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let prompt = |r: &Value| r["usage"]["prompt_tokens"].as_u64().unwrap();
    let mut a = vec![sys.clone(), json!({"role": "user", "content": "Alpha one"})];
    let mut b = vec![sys.clone(), json!({"role": "user", "content": "Beta one"})];
    let ra = ask(&a);
    assert_eq!(cached(&ra), 0);
    let rb = ask(&b);
    // B shares the preamble and the system message with A: resumed at that message's end.
    assert!(cached(&rb) > 0 && cached(&rb) < prompt(&rb), "{rb}");
    let sys_end = cached(&rb);
    for (h, r, q) in [(&mut a, &ra, "Alpha two"), (&mut b, &rb, "Beta two")] {
        let m = &r["choices"][0]["message"];
        h.push(json!({"role": "assistant", "content": m["content"], "reasoning_content": m["reasoning_content"]}));
        h.push(json!({"role": "user", "content": q}));
    }
    let ra2 = ask(&a);
    let rb2 = ask(&b);
    // Each resumes past its own first turn, though the other client ran in between.
    assert!(cached(&ra2) >= prompt(&ra), "{ra2}");
    assert!(cached(&rb2) >= prompt(&rb), "{rb2}");
    // A edits its last turn: resumed at the end of the message before it.
    a.pop();
    a.push(json!({"role": "user", "content": "Alpha two, edited"}));
    let ra3 = ask(&a);
    assert!(
        cached(&ra3) > sys_end && cached(&ra3) < prompt(&ra3),
        "{ra3}"
    );
}
