//! K3's tool calls (spec §4.2): an assistant's calls rendered as a tools section, the
//! request-side instructions (`tool_choice`, `parallel_tool_calls`), and the parser that turns
//! the model's tools section back into calls. Structure counts only where `<|open|>`,
//! `<|close|>` and `<|sep|>` came from special token ids: a value that spells them in ordinary
//! text stays a value. Knows nothing of HTTP or the streaming splitter's phases.
//!
//! The section, as the model writes it after `<|close|>response<|sep|>`:
//! `<|open|>tools<|sep|>` then per call `<|open|>call tool="NAME" index="N"<|sep|>`, typed
//! `<|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>` blocks (a `string`
//! value is raw text, any other type is JSON) or one
//! `<|open|>json type="object"<|sep|>{...}<|close|>json<|sep|>` block, `<|close|>call<|sep|>`;
//! then `<|close|>tools<|sep|>`.

use super::{close_tag, open_tag, Segment};

/// One tool call: the function's name and its arguments as the text of a JSON object.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ToolCall {
    /// The call's id (`call_...`); empty where the model wrote it (the server names it).
    #[serde(default)]
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments: a JSON object's text.
    pub arguments: String,
}

/// What `tool_choice` asks of the reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (the default).
    #[default]
    Auto,
    /// No call: the reply is text, and a tools section the model writes anyway stays text.
    None,
    /// At least one call.
    Required,
    /// A call of this function.
    Function(String),
}

impl ToolChoice {
    /// Whether a reply's tools section is returned as calls, given whether tools are declared.
    pub fn returns_calls(&self, declared: bool) -> bool {
        declared && *self != ToolChoice::None
    }
}

/// The top-level members of a JSON object, in their written order, each value's text compacted;
/// `None` when `s` is not a JSON object. (A `serde_json::Map` would sort them.)
fn ordered_members(s: &str) -> Option<Vec<(String, String)>> {
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(s).ok()?;
    // The text is a valid object: split it at the commas and colons of depth 1.
    let b = s.as_bytes();
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    let (mut members, mut start, mut colon) = (Vec::new(), 0usize, None);
    for (i, &c) in b.iter().enumerate() {
        if in_str {
            match (esc, c) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'{' | b'[' => {
                depth += 1;
                if depth == 1 {
                    start = i + 1;
                }
            }
            b':' if depth == 1 && colon.is_none() => colon = Some(i),
            b',' | b'}' | b']' if depth == 1 => {
                if let Some(k) = colon.take() {
                    let key: String = serde_json::from_str(s[start..k].trim()).ok()?;
                    members.push((key, compact(&s[k + 1..i])));
                }
                start = i + 1;
                if c != b',' {
                    depth -= 1;
                }
            }
            b'}' | b']' => depth -= 1,
            _ => {}
        }
    }
    Some(members)
}

/// JSON text without the whitespace outside its strings (member order kept, unlike a
/// round trip through `serde_json::Value`).
fn compact(raw: &str) -> String {
    let (mut out, mut in_str, mut esc) = (String::with_capacity(raw.len()), false, false);
    for c in raw.chars() {
        if in_str {
            out.push(c);
            match (esc, c) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => in_str = false,
                _ => {}
            }
        } else if !c.is_whitespace() {
            in_str = c == '"';
            out.push(c);
        }
    }
    out
}

/// The `type` attribute of an argument whose value is the JSON text `v`.
fn json_type(v: &str) -> &'static str {
    match v.as_bytes().first() {
        Some(b'"') => "string",
        Some(b'{') => "object",
        Some(b'[') => "array",
        Some(b't' | b'f') => "boolean",
        Some(b'n') => "null",
        _ if v.contains(['.', 'e', 'E']) => "number",
        _ => "integer",
    }
}

/// Renders an assistant's calls as its tools section. Arguments that are a JSON object become
/// typed `argument` blocks in their written order; any other text goes in a raw `json` block
/// as it is, so a history the client holds renders unchanged.
pub(super) fn render_calls(out: &mut Vec<Segment>, calls: &[ToolCall]) {
    open_tag(out, "tools", &[]);
    for (i, c) in calls.iter().enumerate() {
        let index = (i + 1).to_string();
        open_tag(out, "call", &[("tool", &c.name), ("index", &index)]);
        match ordered_members(&c.arguments) {
            Some(members) => {
                for (k, v) in members {
                    let ty = json_type(&v);
                    open_tag(out, "argument", &[("key", &k), ("type", ty)]);
                    let text = match ty {
                        "string" => serde_json::from_str::<String>(&v).unwrap_or(v),
                        _ => v,
                    };
                    out.push(Segment::Text(text));
                    close_tag(out, "argument");
                }
            }
            None => {
                open_tag(out, "json", &[("type", "object")]);
                out.push(Segment::Text(c.arguments.clone()));
                close_tag(out, "json");
            }
        }
        close_tag(out, "call");
    }
    close_tag(out, "tools");
}

/// The system message that carries `tool_choice` and `parallel_tool_calls` (nothing for the
/// defaults: `auto`, parallel calls allowed). K3's renderer names such a message but not its
/// words; these are ours (README, "Tool calls").
pub(super) fn render_choice(out: &mut Vec<Segment>, choice: &ToolChoice, parallel: bool) {
    let mut lines = Vec::new();
    match choice {
        ToolChoice::Auto => {}
        ToolChoice::None => {
            lines.push("Do not call any tool in this reply; answer in text.".into())
        }
        ToolChoice::Required => {
            lines.push("Call at least one of the available tools in this reply.".to_string())
        }
        ToolChoice::Function(n) => lines.push(format!("Call the tool `{n}` in this reply.")),
    }
    if !parallel && *choice != ToolChoice::None {
        lines.push("Call at most one tool in this reply.".into());
    }
    if lines.is_empty() {
        return;
    }
    open_tag(
        out,
        "message",
        &[("role", "system"), ("type", "tool-choice")],
    );
    out.push(Segment::Text(lines.join("\n")));
    close_tag(out, "message");
    out.push(Segment::Control("<|end_of_msg|>".into()));
}

/// A piece of generated text: a structural special token or a run of ordinary text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item<'a> {
    Open,
    Close,
    Sep,
    Text(&'a str),
}

/// Splits text with its per-byte "from a special token" flags into items; a special token
/// other than the three structural ones is text (and makes a call malformed where it stands).
fn items<'a>(text: &'a str, special: &[bool]) -> Vec<Item<'a>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        if special[i] {
            let rest = &text[i..];
            let hit = [
                ("<|open|>", Item::Open),
                ("<|close|>", Item::Close),
                ("<|sep|>", Item::Sep),
            ]
            .into_iter()
            .find(|(s, _)| rest.starts_with(s) && special[i..i + s.len()].iter().all(|&b| b));
            if let Some((s, it)) = hit {
                out.push(it);
                i += s.len();
                continue;
            }
        }
        let start = i;
        i += 1;
        while i < text.len() && (!special[i] || !text.is_char_boundary(i)) {
            i += 1;
        }
        out.push(Item::Text(&text[start..i]));
    }
    // Runs split at a non-structural special token join back into one text item.
    let mut merged: Vec<Item> = Vec::with_capacity(out.len());
    for it in out {
        match (merged.last_mut(), it) {
            (Some(Item::Text(a)), Item::Text(b)) => {
                let start = a.as_ptr() as usize - text.as_ptr() as usize;
                *a = &text[start..start + a.len() + b.len()];
            }
            _ => merged.push(it),
        }
    }
    merged
}

/// `tag` and its attributes from an open tag's text (`call tool="x" index="1"`).
fn tag_attrs(t: &str) -> (&str, Vec<(String, String)>) {
    let name_end = t.find(|c: char| c.is_whitespace()).unwrap_or(t.len());
    let mut attrs = Vec::new();
    let mut rest = &t[name_end..];
    while let Some(eq) = rest.find("=\"") {
        let key = rest[..eq]
            .trim()
            .rsplit(char::is_whitespace)
            .next()
            .unwrap_or("");
        let after = &rest[eq + 2..];
        let Some(end) = after.find('"') else { break };
        let value = after[..end].replace("&quot;", "\"").replace("&amp;", "&");
        attrs.push((key.to_string(), value));
        rest = &after[end + 1..];
    }
    (&t[..name_end], attrs)
}

fn attr<'a>(attrs: &'a [(String, String)], k: &str) -> Option<&'a str> {
    attrs
        .iter()
        .rev()
        .find(|(a, _)| a == k)
        .map(|(_, v)| v.as_str())
}

/// A block's attributes, value and length in items.
type Block<'a> = (Vec<(String, String)>, &'a str, usize);

/// A block `<|open|>TAG attrs<|sep|>[value]<|close|>TAG<|sep|>` at the head of `it`.
fn block<'a>(it: &[Item<'a>], tag: &str) -> Option<Block<'a>> {
    let (Item::Open, Item::Text(head), Item::Sep) = (*it.first()?, *it.get(1)?, *it.get(2)?) else {
        return None;
    };
    let (name, attrs) = tag_attrs(head);
    if name != tag {
        return None;
    }
    let (value, at) = match it.get(3)? {
        Item::Text(v) => (*v, 4),
        _ => ("", 3),
    };
    match (it.get(at)?, it.get(at + 1)?, it.get(at + 2)?) {
        (Item::Close, Item::Text(t), Item::Sep) if *t == tag => Some((attrs, value, at + 3)),
        _ => None,
    }
}

/// The arguments' JSON text from a call body's blocks: the first `json` block (which must
/// hold an object) wins over `argument` blocks; a non-`string` value that is not JSON is kept
/// as a string; text and other blocks between them are skipped (as mlx-lm's parser does).
/// `None` when the body is malformed (a bad json block, an argument without a key).
fn arguments(body: &[Item]) -> Option<String> {
    let blocks = |tag: &'static str| {
        let mut i = 0;
        std::iter::from_fn(move || {
            while i < body.len() {
                if let Some((attrs, v, n)) = block(&body[i..], tag) {
                    i += n;
                    return Some((attrs, v));
                }
                i += 1;
            }
            None
        })
    };
    // Values keep the model's text (compacted): a round trip through f64 could move a
    // number's last digit, and a map would sort the keys.
    let is_json = |v: &str| serde_json::from_str::<serde_json::Value>(v).is_ok();
    if let Some((_, v)) = blocks("json").next() {
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(v).ok()?;
        return Some(compact(v));
    }
    let mut members: Vec<(String, String)> = Vec::new();
    for (attrs, v) in blocks("argument") {
        let key = attr(&attrs, "key")?.to_string();
        let value = match attr(&attrs, "type").unwrap_or("string") {
            "string" => serde_json::Value::String(v.into()).to_string(),
            _ if is_json(v) => compact(v),
            _ => serde_json::Value::String(v.into()).to_string(),
        };
        members.retain(|(k, _)| *k != key);
        members.push((key, value));
    }
    let body: Vec<String> = members
        .iter()
        .map(|(k, v)| format!("{}:{v}", serde_json::Value::String(k.clone())))
        .collect();
    Some(format!("{{{}}}", body.join(",")))
}

/// Parses one call, `<|open|>call ...<|sep|>` through `<|close|>call<|sep|>`, from text and
/// its special flags; `None` when it is malformed (no name, a bad block, a json block that is
/// not an object).
pub fn parse_call(text: &str, special: &[bool]) -> Option<ToolCall> {
    let it = items(text, special);
    let (Item::Open, Item::Text(head), Item::Sep) = (*it.first()?, *it.get(1)?, *it.get(2)?) else {
        return None;
    };
    let (tag, attrs) = tag_attrs(head);
    let n = it.len();
    if tag != "call" || n < 6 || it[n - 3] != Item::Close || it[n - 1] != Item::Sep {
        return None;
    }
    if it[n - 2] != Item::Text("call") {
        return None;
    }
    let name = attr(&attrs, "tool").filter(|s| !s.is_empty())?.to_string();
    Some(ToolCall {
        id: String::new(),
        name,
        arguments: arguments(&it[3..n - 3])?,
    })
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
