use super::*;
use crate::chat::tests::fixture_tok;
use crate::checkpoint::rng::Rng;

fn accepts(text: &str) -> (bool, bool) {
    let mut s = JsonState::default();
    let ok = text.bytes().all(|b| s.feed(b));
    (ok, s.done())
}

#[test]
fn the_recognizer_takes_objects_and_refuses_the_rest() {
    for t in [
        "{}",
        "{\"a\": 1}",
        "{\"a\":[1,-2.5e+3,0,0.25,1E9,true,false,null,\"x\\\"y\\u00e9\\n\"],\"b\":{\"c\":{}}, \"d\": []}",
        "{\"漢字\": \"🦀\"}\n",
        "{\"a\":[[],[{}]]}",
    ] {
        assert_eq!(accepts(t), (true, true), "{t}");
        serde_json::from_str::<serde_json::Value>(t).unwrap();
    }
    for t in [
        "[1]",
        "{\"a\":[1,]}",
        "{\"a\" 1}",
        "{'a':1}",
        "{\"a\":01}",
        "{\"a\":1.}",
        "{\"a\":\"\\x\"}",
        "{\"a\":tru}",
        "{} x",
        "{\"a\":1,}",
        "{,}",
        "{\"a\":-}",
        "{\"a\":\"\u{1}\"}",
        "{\"a\":[}",
        "{\"a\":1]",
        "1",
    ] {
        let (ok, done) = accepts(t);
        assert!(!(ok && done), "{t} accepted");
        assert!(
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(t).is_err(),
            "{t}"
        );
    }
    // Prefixes of a valid object are accepted, and not done.
    let t = "{\"a\": [1, {\"b\": \"c\"}]}";
    for k in 1..t.len() {
        assert_eq!(accepts(&t[..k]), (true, false), "{}", &t[..k]);
    }
}

/// Sampling uniformly among the tokens the mask lets through always gives JSON: every reply
/// that completes parses as an object, and no masked step is left without a choice.
#[test]
fn masked_sampling_only_writes_json_objects() {
    let tok = fixture_tok();
    let vocab = tok.num_ranks() as usize + 256;
    let table = token_table(&tok, vocab);
    let (mut done, mut r) = (0, Rng::new(3));
    for _ in 0..40 {
        let mut m = JsonMask::new(table.clone());
        let mut ids = Vec::new();
        while !m.done() && ids.len() < 300 {
            let mut l: Vec<f32> = (0..vocab).map(|_| r.uniform() as f32).collect();
            // Lean towards closing so that replies end.
            for (i, t) in table.iter().enumerate() {
                if t.as_ref()
                    .is_some_and(|b| b.contains(&b'}') || b.contains(&b']'))
                {
                    l[i] += 0.5;
                }
            }
            m.apply(&mut l);
            let id = crate::runtime::generate::argmax(&l);
            assert!(
                l[id as usize].is_finite(),
                "no token left after {:?}",
                tok.decode(&ids)
            );
            m.advance(id);
            ids.push(id);
        }
        if m.done() {
            done += 1;
            let text = tok.decode(&ids);
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&text)
                .unwrap_or_else(|e| panic!("{text:?}: {e}"));
        }
    }
    assert!(done >= 20, "only {done} of 40 replies closed");
}

/// The mask's cost at K3's vocabulary (163,840 ids, token lengths 1-16 bytes, mean 8.5, above
/// K3's), inside a string (most tokens take the plain-string path; the rest are walked):
/// median, min and max of 5. `cargo test --release --lib -- --ignored json_mask_cost
/// --nocapture`.
#[test]
#[ignore]
fn json_mask_cost_at_k3_vocab() {
    let mut m = JsonMask::new(crate::chat::tests::k3_size_table());
    let mut s = JsonState::default();
    for b in b"{\"text\": \"abc" {
        assert!(s.feed(*b));
    }
    m.grammar = Grammar::Object(s);
    crate::chat::tests::report_apply_ms("json mask", &m, 163_840);
}
