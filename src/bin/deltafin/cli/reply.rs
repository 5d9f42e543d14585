//! Chat helpers the front-end commands share: a generated reply as text, split by the chat
//! format into reasoning and content, and today's date for formats that render one.

use deltafin::chat::ChatOptions;

/// The reply as text: with `chat`, `{"reasoning", "content"}` split by the chat format's
/// splitter on token ids; else `{"content"}`.
pub fn reply_text(
    engine: &deltafin::Engine,
    ids: &[u32],
    chat: bool,
    opts: &ChatOptions,
) -> serde_json::Value {
    let tok = engine.tokenizer();
    if !chat {
        return serde_json::json!({ "content": tok.decode(ids) });
    }
    let Ok(mut split) = engine
        .chat_format()
        .splitter(engine.tokenizer_arc(), opts.thinking, false)
    else {
        return serde_json::json!({ "content": tok.decode(ids) });
    };
    let mut dec = deltafin::tokenizer::StreamDecoder::new();
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut take = |d: Vec<deltafin::chat::Delta>| {
        for x in d {
            match x {
                deltafin::chat::Delta::Reasoning(t) => reasoning.push_str(&t),
                deltafin::chat::Delta::Content(t) => content.push_str(&t),
                deltafin::chat::Delta::ToolCall(_) => {}
            }
        }
    };
    for &id in ids {
        take(split.push_id(tok, &mut dec, id));
    }
    take(split.finish(&mut dec));
    serde_json::json!({"reasoning": reasoning, "content": content})
}

/// Today's date (UTC) as YYYY-MM-DD, for chat formats that render one.
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    deltafin::chat::harmony::civil_date(secs)
}
