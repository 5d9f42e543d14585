//! The trainer's token stream: corpus paragraphs as plain text, and a seeded share of them framed
//! as chat turns in K3's XTML (a user line, an assistant answer with or without a `think` part,
//! each turn closed with `<|end_of_msg|>`) so chat answers learn to end; plus the windows a step
//! trains on and the windows an evaluation scores. Owns no model code.

use crate::chat::{encode_segments, render_conversation, ChatOptions, Message, Segment};
use crate::checkpoint::rng::Rng;
use crate::tokenizer::Tokenizer;
use crate::Result;

/// Sentences of a paragraph, its lines joined with single spaces.
fn sentences(paragraph: &str) -> Vec<String> {
    let flat = paragraph.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    let mut cur = String::new();
    let chars: Vec<char> = flat.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        cur.push(c);
        let end = matches!(c, '.' | '!' | '?') && chars.get(i + 1).is_none_or(|n| *n == ' ');
        if end && cur.trim().len() > 1 {
            out.push(cur.trim().to_string());
            cur.clear();
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// One user turn and its answer made from `paragraph` (the first sentence asks; with `think`
/// the second is the reasoning; the next one or two answer), or `None` when it is unfit.
fn turn(paragraph: &str, think: bool) -> Option<(Message, Message)> {
    let s = sentences(paragraph);
    let need = if think { 3 } else { 2 };
    if s.len() < need || s.iter().any(|x| x.len() > 400) {
        return None;
    }
    let user = Message::new("user", &s[0]);
    let mut reply = Message::new("assistant", &s[need - 1..s.len().min(need + 1)].join(" "));
    if think {
        reply.reasoning_content = Some(s[1].clone());
    }
    Some((user, reply))
}

/// The tokens of a conversation (control segments looked up as one special each).
fn conversation_ids(tok: &Tokenizer, messages: &[Message], think: bool) -> Result<Vec<u32>> {
    let opts = if think {
        ChatOptions::default()
    } else {
        ChatOptions {
            thinking: false,
            ..ChatOptions::default()
        }
    };
    let mut ids = Vec::new();
    for seg in &render_conversation(messages, &opts)? {
        match seg {
            Segment::Control(t) => match tok.special_id(t) {
                Some(id) => ids.push(id),
                None => ids.extend(encode_segments(tok, std::slice::from_ref(seg))),
            },
            Segment::Text(t) => ids.extend(tok.encode_ordinary(t)),
        }
    }
    Ok(ids)
}

/// The training stream of `text`: paragraphs in order; a `chat_fraction` of them (chosen by
/// `seed`) start a conversation whose turns are the following paragraphs (one to twelve turns,
/// half of the conversations with `think` parts), so multi-turn chats are seen too.
pub fn stream(tok: &Tokenizer, text: &str, chat_fraction: f64, seed: u64) -> Result<Vec<u32>> {
    let mut rng = Rng::new(seed ^ 0x5EED_DA7A);
    let mut out = Vec::with_capacity(text.len() / 3);
    let mut plain = String::new();
    let paras: Vec<&str> = text.split("\n\n").collect();
    let mut i = 0;
    while i < paras.len() {
        let para = paras[i];
        i += 1;
        if !para.trim().is_empty() && rng.uniform() < chat_fraction {
            let think = rng.uniform() < 0.5;
            let turns = 1 + rng.below(12) as usize;
            let mut messages = Vec::new();
            if let Some((u, a)) = turn(para, think) {
                messages.extend([u, a]);
                while messages.len() < 2 * turns && i < paras.len() {
                    let Some((u, a)) = turn(paras[i], think) else {
                        break;
                    };
                    messages.extend([u, a]);
                    i += 1;
                }
                out.extend(tok.encode_ordinary(&plain));
                plain.clear();
                out.extend(conversation_ids(tok, &messages, think)?);
                continue;
            }
        }
        plain.push_str(para);
        plain.push_str("\n\n");
        if plain.len() > 1 << 16 {
            out.extend(tok.encode_ordinary(&plain));
            plain.clear();
        }
    }
    out.extend(tok.encode_ordinary(&plain));
    Ok(out)
}

/// The `batch` windows of `len + 1` tokens step `step` trains on (seeded, so a resumed run sees
/// the batches an uninterrupted one would).
pub fn batch_windows(
    tokens: &[u32],
    step: usize,
    batch: usize,
    len: usize,
    seed: u64,
) -> Vec<&[u32]> {
    let mut rng = Rng::new(seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let span = tokens.len().saturating_sub(len + 1).max(1) as u64;
    (0..batch)
        .map(|_| {
            let s = rng.below(span) as usize;
            &tokens[s..(s + len + 1).min(tokens.len())]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_split_on_end_marks() {
        let s = sentences("It was late.  He\nleft! Did she? Yes");
        assert_eq!(s, vec!["It was late.", "He left!", "Did she?", "Yes"]);
    }
}
