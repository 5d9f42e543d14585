//! A function's JSON Schema parameters as harmony's TypeScript type, laid out as OpenAI's
//! renderer (openai-harmony) lays it out, which is what gpt-oss was trained to read; checked
//! token for token by scripts/harmony_check.py. The rules, as that renderer applies them:
//! properties in declared order, `?` unless required; comments above a property for its
//! `title` (then an empty `//`), `description` and string `examples`; `default` after the type
//! (`"quoted"` for a plain string, bare for an enum's string, JSON otherwise); nested objects'
//! property lines indented four more spaces; `oneOf` as ` | ` lines (three more spaces);
//! `nullable` adds `| null`; a type list joins its names; string enums become literal unions,
//! `integer` is `number`, an array without `items` is `Array<any>`; anything else (`anyOf`,
//! an enum or `null` with no string type, no type at all) is `any`. Owns this rendering only.

use serde_json::Value;

/// `schema` as a TypeScript type; `indent` prefixes its property lines.
pub fn ts_type(schema: &Value, indent: &str) -> String {
    if let Some(variants) = schema.get("oneOf").and_then(Value::as_array) {
        let deeper = format!("{indent}   ");
        return variants
            .iter()
            .map(|v| format!("\n{indent} | {}{}", variant(v, &deeper), trailing(v, None)))
            .collect();
    }
    if let Some(types) = schema.get("type").and_then(Value::as_array) {
        let names: Vec<&str> = types
            .iter()
            .filter_map(Value::as_str)
            .map(|t| if t == "integer" { "number" } else { t })
            .collect();
        if !names.is_empty() {
            return names.join(" | ");
        }
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => object(schema, indent),
        Some("string") => {
            let literals: Vec<String> = schema
                .get("enum")
                .and_then(Value::as_array)
                .map(|e| {
                    e.iter()
                        .filter_map(Value::as_str)
                        .map(|s| format!("\"{s}\""))
                        .collect()
                })
                .unwrap_or_default();
            match literals.is_empty() {
                true => "string".into(),
                false => literals.join(" | "),
            }
        }
        Some("number" | "integer") => "number".into(),
        Some("boolean") => "boolean".into(),
        Some("array") => match schema.get("items") {
            Some(items) => format!("{}[]", ts_type(items, indent)),
            None => "Array<any>".into(),
        },
        _ => "any".into(),
    }
}

/// A union member's type with `| null` when it is `nullable`.
fn variant(v: &Value, indent: &str) -> String {
    let t = ts_type(v, indent);
    match v.get("nullable").and_then(Value::as_bool) == Some(true) && !t.contains("null") {
        true => format!("{t} | null"),
        false => t,
    }
}

/// ` // description default: …` after a union member (`skip`: a description already shown).
fn trailing(v: &Value, skip: Option<&str>) -> String {
    let mut parts = Vec::new();
    if let Some(d) = v.get("description").and_then(Value::as_str) {
        if Some(d) != skip {
            parts.push(d.to_string());
        }
    }
    if let Some(d) = v.get("default") {
        parts.push(format!("default: {}", default_text(d, v)));
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!(" // {}", parts.join(" ")),
    }
}

/// A default as harmony writes it: a plain string quoted (unescaped), an enum's string bare,
/// anything else as JSON.
fn default_text(d: &Value, schema: &Value) -> String {
    let is_enum = schema
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(|e| !e.is_empty());
    match d {
        Value::String(s) if is_enum => s.clone(),
        Value::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    }
}

fn object(schema: &Value, indent: &str) -> String {
    let mut out = String::new();
    if let Some(d) = schema.get("description").and_then(Value::as_str) {
        out.push_str(&format!("{indent}// {d}\n"));
    }
    out.push_str("{\n");
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (key, val) in props {
            let opt = if required.contains(&key.as_str()) {
                ""
            } else {
                "?"
            };
            out.push_str(&property(key, opt, val, indent));
        }
    }
    out.push_str(&format!("{indent}}}"));
    out
}

/// One property: its comments, then `name?: type,` (a `oneOf` as one line per member).
fn property(key: &str, opt: &str, val: &Value, indent: &str) -> String {
    let mut out = String::new();
    let comment = |out: &mut String, s: &str| out.push_str(&format!("{indent}// {s}\n"));
    if let Some(t) = val.get("title").and_then(Value::as_str) {
        comment(&mut out, t);
        out.push_str(&format!("{indent}//\n"));
    }
    let desc = val.get("description").and_then(Value::as_str);
    let one_of = val.get("oneOf");
    if let (None, Some(d)) = (one_of, desc) {
        comment(&mut out, d);
    }
    if let Some(ex) = val.get("examples").and_then(Value::as_array) {
        if !ex.is_empty() {
            comment(&mut out, "Examples:");
        }
        for e in ex.iter().filter_map(Value::as_str) {
            comment(&mut out, &format!("- \"{e}\""));
        }
    }
    if let Some(variants) = one_of.and_then(Value::as_array) {
        // The property's description goes above, unless its first member repeats it.
        let first = variants
            .first()
            .and_then(|v| v.get("description"))
            .and_then(Value::as_str);
        let above = desc.filter(|d| Some(*d) != first);
        if let Some(d) = above {
            comment(&mut out, d);
        }
        if let Some(d) = val.get("default") {
            comment(&mut out, &format!("default: {}", default_text(d, val)));
        }
        out.push_str(&format!("{indent}{key}{opt}:\n"));
        let deeper = format!("{indent}   ");
        for (i, v) in variants.iter().enumerate() {
            let t = variant(v, &deeper);
            let tail = match (i, above) {
                // The first member's description was shown above.
                (0, Some(_)) => trailing(&without_description(v), None),
                _ => trailing(v, desc),
            };
            out.push_str(&format!("{indent} | {t}{tail}\n"));
        }
        out.push_str(&format!("{indent},\n"));
        return out;
    }
    out.push_str(&format!(
        "{indent}{key}{opt}: {},",
        variant(val, &format!("{indent}    "))
    ));
    // (A `oneOf` that is not a list shows neither description nor default.)
    if let (None, Some(d)) = (one_of, val.get("default")) {
        out.push_str(&format!(" // default: {}", default_text(d, val)));
    }
    out.push('\n');
    out
}

fn without_description(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("description");
    }
    v
}
