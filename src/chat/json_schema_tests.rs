use super::*;
use crate::chat::tests::fixture_tok;
use crate::chat::{token_table, JsonMask, SchemaMachine};
use crate::checkpoint::rng::Rng;
use serde_json::{json, Value};
use std::sync::Arc;

/// Objects' keys come in name order (serde_json's map): age, extra, free, kind, name, ok, role,
/// score, tags, tree; required: age, kind, name, tags.
fn person() -> Value {
    json!({
        "type": "object",
        "title": "person",
        "properties": {
            "name": {"type": "string", "description": "a name"},
            "age": {"type": "integer"},
            "role": {"enum": ["admin", "user", null, 12, 1]},
            "score": {"type": ["number", "null"]},
            "tags": {"type": "array", "items": {"type": "string", "format": "hostname"}, "minItems": 1, "maxItems": 3},
            "ok": {"type": "boolean"},
            "tree": {"$ref": "#/$defs/node"},
            "kind": {"const": "v1"},
            "extra": {},
            "free": {"type": "object"}
        },
        "required": ["name", "age", "tags", "kind"],
        "additionalProperties": false,
        "$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "integer"},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}
        }, "required": ["v"]}}
    })
}

/// Schemas for the sampling tests and the corpus that scripts/schema_check.py validates.
pub(crate) fn corpus_schemas() -> Vec<Value> {
    vec![
        person(),
        // OpenAI's structured-outputs example shape (strict: everything required, closed).
        json!({"type": "object", "properties": {
            "steps": {"type": "array", "items": {"type": "object", "properties": {
                "explanation": {"type": "string"}, "output": {"type": "string"}},
                "required": ["explanation", "output"], "additionalProperties": false}},
            "final_answer": {"type": "string"}},
            "required": ["steps", "final_answer"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
            "where": {"anyOf": [
                {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}, "required": ["lat", "lon"]},
                {"type": "string"}, {"type": "null"}]},
            "ratios": {"type": "array", "items": {"type": "number"}, "maxItems": 4},
            "empty": {"type": "object", "additionalProperties": false}},
            "required": ["unit", "where", "empty"]}),
    ]
}

fn walk(s: &Schema, text: impl AsRef<[u8]>) -> (bool, bool) {
    let mut m = SchemaMachine::new(s);
    let ok = text.as_ref().iter().all(|&b| m.feed(s, b));
    (ok, m.done())
}

#[test]
fn the_walk_takes_valid_replies_and_refuses_the_rest() {
    let s = Schema::compile(&person()).unwrap();
    let good = [
        r#"{"age":3,"kind":"v1","name":"a","tags":["x"]}"#,
        r#"{"age": -12, "extra": [1, {"a": null}], "free": {"z": 1}, "kind": "v1", "name": "b\"c\u00e9", "ok": true, "role": 12, "score": null, "tags": ["x", "y", "z"], "tree": {"kids": [{"v": 2}, {"kids": [], "v": 3}], "v": 1}}"#,
        r#"{"age":0,"extra":5,"kind":"v1","name":"","role":1,"score":-1.5e3,"tags":["漢字"]}"#,
        "{\"age\": 1,\n  \"kind\": \"v1\", \"name\": \"n\", \"role\": null, \"tags\": [\"t\"], \"tree\": {\"v\": 0}}",
    ];
    for t in good {
        assert_eq!(walk(&s, t), (true, true), "{t}");
        for k in 1..t.len() {
            assert_eq!(
                walk(&s, &t.as_bytes()[..k]),
                (true, false),
                "{:?}",
                String::from_utf8_lossy(&t.as_bytes()[..k])
            );
        }
        let v: Value = serde_json::from_str(t).unwrap();
        assert!(v.is_object());
    }
    let bad = [
        r#"{"age":3,"kind":"v1","name":"a"}"#,
        r#"{"kind":"v1","age":3,"name":"a","tags":["x"]}"#,
        r#"{"age":3,"zzz":1,"kind":"v1","name":"a","tags":["x"]}"#,
        r#"{"age":3.5,"kind":"v1","name":"a","tags":["x"]}"#,
        r#"{"age":3,"kind":"v1","name":"a","role":"root","tags":["x"]}"#,
        r#"{"age":3,"kind":"v1","name":"a","role":123,"tags":["x"]}"#,
        r#"{"age":3,"kind":"v1","name":"a","tags":[]}"#,
        r#"{"age":3,"kind":"v1","name":"a","tags":["a","b","c","d"]}"#,
        r#"{"age":3,"kind":"v2","name":"a","tags":["x"]}"#,
        r#"{"age":3,"kind":"v1","name":"a","tags":["x"],"tree":{}}"#,
        r#"{"age":3,"kind":"v1","name":"a","ok":1,"tags":["x"]}"#,
        r#" {"age":3,"kind":"v1","name":"a","tags":["x"]}"#,
        r#"{"age":3,"kind":"v1","name":1,"tags":["x"]}"#,
        r#"{"age":3,"kind":"v1","name":"a","tags":["x"],}"#,
        r#"{"age":3,"kind":"v1","name":"a","score":01,"tags":["x"]}"#,
        "{\"age\":3,\n\n\"kind\":\"v1\",\"name\":\"a\",\"tags\":[\"x\"]}",
    ];
    for t in bad {
        let (ok, done) = walk(&s, t);
        assert!(!(ok && done), "{t} accepted");
    }
}

#[test]
fn compile_refuses_what_the_mask_cannot_keep() {
    let cases = [
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 1}}}),
            "/properties/a`: `minLength`",
        ),
        (json!({"type": "string"}), "root must be an object"),
        (
            json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "object"}, {"type": "object", "properties": {}}]}}}),
            "cannot be told apart",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": ["integer", "number"]}}}),
            "cannot be told apart",
        ),
        (
            json!({"type": "object", "required": ["x"], "properties": {"a": {}}}),
            "required `x`",
        ),
        (
            json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
            "does not point",
        ),
        (
            json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/l"}}, "$defs": {"l": {"$ref": "#/$defs/l"}}}),
            "cycle",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "array", "items": [{}]}}}),
            "tuple",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 2}}}),
            "above",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "number", "minimum": 0}}}),
            "`minimum`",
        ),
    ];
    for (schema, want) in cases {
        let e = Schema::compile(&schema).expect_err(&schema.to_string());
        assert!(e.to_string().contains(want), "{schema}: {e}");
    }
}

/// Samples one reply with random logits under `mask` (leaning towards closing characters so
/// that replies end); `None` when it did not end in 400 tokens.
pub(crate) fn sample(
    mut mask: JsonMask,
    table: &[Option<Vec<u8>>],
    r: &mut Rng,
    tok: &crate::tokenizer::Tokenizer,
) -> Option<String> {
    let mut ids = Vec::new();
    while !mask.done() && ids.len() < 400 {
        let mut l: Vec<f32> = (0..table.len()).map(|_| r.uniform() as f32).collect();
        for (i, t) in table.iter().enumerate() {
            if t.as_ref()
                .is_some_and(|b| b.iter().any(|c| b"}]\"".contains(c)))
            {
                l[i] += 0.6;
            }
        }
        mask.apply(&mut l);
        let id = crate::runtime::generate::argmax(&l);
        assert!(
            l[id as usize].is_finite(),
            "no token left after {:?}",
            tok.decode(&ids)
        );
        mask.advance(id);
        ids.push(id);
    }
    mask.done().then(|| tok.decode(&ids))
}

/// Every sampled reply that ends parses, has each required key, and keeps declared order.
#[test]
fn masked_sampling_follows_the_schema() {
    let tok = fixture_tok();
    let vocab = tok.num_ranks() as usize + 256;
    let table = token_table(&tok, vocab);
    let (mut r, mut ended) = (Rng::new(7), 0);
    let schema = person();
    let s = Arc::new(Schema::compile(&schema).unwrap());
    for _ in 0..30 {
        let Some(text) = sample(
            JsonMask::with_schema(table.clone(), s.clone()),
            &table,
            &mut r,
            &tok,
        ) else {
            continue;
        };
        ended += 1;
        let v: serde_json::Map<String, Value> =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        for k in ["name", "age", "tags", "kind"] {
            assert!(v.contains_key(k), "{text}");
        }
        assert_eq!(v["kind"], "v1");
        assert!(v["age"].is_i64() || v["age"].is_u64(), "{text}");
        let n = v["tags"].as_array().map_or(0, |a| a.len());
        assert!((1..=3).contains(&n), "{text}");
    }
    assert!(ended >= 10, "only {ended} of 30 replies ended");
}

/// Writes, for each corpus schema, replies sampled under the schema's mask and (the control)
/// under the plain json_object mask, to DELTAFIN_SCHEMA_CORPUS (JSON lines), for
/// scripts/schema_check.py to validate with the `jsonschema` package.
#[test]
#[ignore]
fn write_schema_corpus() {
    use std::io::Write;
    let path = std::env::var("DELTAFIN_SCHEMA_CORPUS").expect("DELTAFIN_SCHEMA_CORPUS");
    let tok = fixture_tok();
    let vocab = tok.num_ranks() as usize + 256;
    let table = token_table(&tok, vocab);
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut r = Rng::new(11);
    for schema in corpus_schemas() {
        let s = Arc::new(Schema::compile(&schema).unwrap());
        let (mut replies, mut control) = (Vec::new(), Vec::new());
        for _ in 0..40 {
            let m = JsonMask::with_schema(table.clone(), s.clone());
            replies.extend(sample(m, &table, &mut r, &tok));
        }
        for _ in 0..10 {
            control.extend(sample(JsonMask::new(table.clone()), &table, &mut r, &tok));
        }
        let line = json!({"schema": schema, "replies": replies, "control": control});
        writeln!(out, "{line}").unwrap();
    }
    out.flush().unwrap();
}

/// The schema mask's cost at K3's vocabulary size, as `json_mask_cost_at_k3_vocab` measures
/// json_object's, in two states: inside a string value (most tokens take the plain-string
/// path) and before an item of an any-value array (tokens starting with a value byte are
/// walked). Median, min and max of 5.
#[test]
#[ignore]
fn schema_mask_cost_at_k3_vocab() {
    let table = crate::chat::tests::k3_size_table();
    let s = Arc::new(Schema::compile(&person()).unwrap());
    for state in [
        &br#"{"age":3,"kind":"v1","name":"abc"#[..],
        br#"{"age":3,"extra":[1,"#,
    ] {
        let mut m = JsonMask::with_schema(table.clone(), s.clone());
        m.feed_text(state);
        let what = format!("schema mask after {:?}", String::from_utf8_lossy(state));
        crate::chat::tests::report_apply_ms(&what, &m, 163_840);
    }
}
