//! `response_format` kept by a mask over the vocabulary: a byte-level recognizer (for
//! `json_object` one top-level object, nesting to 64; for `json_schema` the walk of
//! `schema_machine`) is run over each token's bytes from the current state, and tokens that
//! cannot continue a valid reply get `-inf` before the chooser sees the logits. Once the value
//! closes, only the end of the reply is allowed.
//! Written here because the cost is one pass over the vocabulary's bytes per token (measured in
//! README, "response_format"), far below a decode step; knows nothing of the model or HTTP.

use super::json_schema::Schema;
use super::schema_machine::SchemaMachine;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;

const MAX_DEPTH: usize = 64;
/// Whitespace between tokens of the object: at most this many bytes in a run, and one line
/// break (a model left free pads with blank lines forever; indentation still fits).
const MAX_WS: u8 = 12;

/// Where the recognizer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Before the top-level object (whitespace, then `{`).
    Start,
    /// A value is expected.
    Value,
    /// After `[`: a value or `]`.
    ArrStart,
    /// After `{`: a key or `}`.
    KeyOrEnd,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value: `,` or the container's close.
    After,
    /// In a string (`key`: an object key); `esc`: 0 plain, 1 after `\`, 2..=5 hex digits left + 1.
    Str { key: bool, esc: u8 },
    /// In a number; `at`: 0 after `-`, 1 after a leading 0, 2 in the integer digits, 3 after
    /// `.`, 4 in the fraction, 5 after `e`, 6 after the exponent's sign, 7 and 8 after its
    /// first and second digit.
    Num(u8),
    /// In `true`/`false`/`null`: the literal and the bytes matched.
    Lit(u8, u8),
    /// The top-level object closed.
    Done,
}

const LITS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// What a byte inside a string does.
pub(crate) enum StrByte {
    /// The closing quote.
    Close,
    /// The string goes on, in this escape state.
    Next(u8),
}

/// A byte inside a string in escape state `esc` (0 plain, 1 after `\`, 2..=5 hex digits
/// left + 1); `None` when no JSON string continues with it.
pub(crate) fn string_byte(esc: u8, b: u8) -> Option<StrByte> {
    Some(StrByte::Next(match (esc, b) {
        (0, b'"') => return Some(StrByte::Close),
        (0, b'\\') => 1,
        (0, 0..=0x1f) => return None,
        (0, _) => 0,
        (1, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => 0,
        (1, b'u') => 5,
        (2, _) if b.is_ascii_hexdigit() => 0,
        (3..=5, _) if b.is_ascii_hexdigit() => esc - 1,
        _ => return None,
    }))
}

/// The recognizer's state (`Copy`: each token is tried from a copy).
#[derive(Debug, Clone, Copy)]
pub struct JsonState {
    mode: Mode,
    /// Open containers, `true` for an object.
    stack: u64,
    depth: u8,
    /// The current whitespace run's length and whether it broke a line.
    ws_run: u8,
    ws_nl: bool,
}

impl Default for JsonState {
    fn default() -> Self {
        JsonState {
            mode: Mode::Start,
            stack: 0,
            depth: 0,
            ws_run: 0,
            ws_nl: false,
        }
    }
}

fn ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl JsonState {
    /// Whether the top-level object is complete.
    pub fn done(&self) -> bool {
        self.mode == Mode::Done
    }

    /// A state expecting any one JSON value (not only an object), for schema parts that
    /// allow any value.
    pub(crate) fn any_value() -> Self {
        JsonState {
            mode: Mode::Value,
            ..Default::default()
        }
    }

    /// Whether the state is inside a string, not in an escape.
    pub(crate) fn plain_string(&self) -> bool {
        matches!(self.mode, Mode::Str { esc: 0, .. })
    }

    /// Whether a top-level number is complete (it ends at the next byte, which is not its).
    pub(crate) fn number_complete(&self) -> bool {
        self.depth == 0 && matches!(self.mode, Mode::Num(1 | 2 | 4 | 7 | 8))
    }

    fn in_object(&self) -> bool {
        self.depth > 0 && (self.stack >> (self.depth - 1)) & 1 == 1
    }

    fn push(&mut self, object: bool) -> bool {
        if self.depth as usize >= MAX_DEPTH {
            return false;
        }
        self.stack = (self.stack & !(1 << self.depth)) | ((object as u64) << self.depth);
        self.depth += 1;
        self.mode = if object {
            Mode::KeyOrEnd
        } else {
            Mode::ArrStart
        };
        true
    }

    /// Closes a value: back in the container, or done at the top.
    fn value_end(&mut self) {
        self.mode = if self.depth == 0 {
            Mode::Done
        } else {
            Mode::After
        };
    }

    fn close(&mut self, b: u8) -> bool {
        if self.depth == 0 || (b == b'}') != self.in_object() {
            return false;
        }
        self.depth -= 1;
        self.value_end();
        true
    }

    /// Starts a value at byte `b`.
    fn value(&mut self, b: u8, first_in_array: bool) -> bool {
        match b {
            b'{' => self.push(true),
            b'[' => self.push(false),
            b']' if first_in_array => self.close(b),
            b'"' => {
                self.mode = Mode::Str { key: false, esc: 0 };
                true
            }
            b'-' => {
                self.mode = Mode::Num(0);
                true
            }
            b'0' => {
                self.mode = Mode::Num(1);
                true
            }
            b'1'..=b'9' => {
                self.mode = Mode::Num(2);
                true
            }
            b't' | b'f' | b'n' => {
                let l = LITS.iter().position(|l| l[0] == b).unwrap_or(0);
                self.mode = Mode::Lit(l as u8, 1);
                true
            }
            _ => ws(b),
        }
    }

    /// Feeds one byte; `false` (state unspecified) when no valid object continues with it.
    pub fn feed(&mut self, b: u8) -> bool {
        let between = !matches!(self.mode, Mode::Str { .. } | Mode::Lit(..) | Mode::Num(_));
        if between && ws(b) {
            // The reply opens with `{`; whitespace runs between tokens stay short.
            let nl = b == b'\n' || b == b'\r';
            if self.mode == Mode::Start || self.ws_run >= MAX_WS || (nl && self.ws_nl) {
                return false;
            }
            self.ws_run += 1;
            self.ws_nl |= nl;
            return true;
        }
        (self.ws_run, self.ws_nl) = (0, false);
        match self.mode {
            Mode::Start => match b {
                b'{' => self.push(true),
                _ => ws(b),
            },
            Mode::Value => self.value(b, false),
            Mode::ArrStart => self.value(b, true),
            Mode::KeyOrEnd | Mode::Key => match b {
                b'"' => {
                    self.mode = Mode::Str { key: true, esc: 0 };
                    true
                }
                b'}' if self.mode == Mode::KeyOrEnd => self.close(b),
                _ => ws(b),
            },
            Mode::Colon => match b {
                b':' => {
                    self.mode = Mode::Value;
                    true
                }
                _ => ws(b),
            },
            Mode::After => match b {
                b',' => {
                    self.mode = if self.in_object() {
                        Mode::Key
                    } else {
                        Mode::Value
                    };
                    true
                }
                b'}' | b']' => self.close(b),
                _ => ws(b),
            },
            Mode::Str { key, esc } => self.string(b, key, esc),
            Mode::Num(at) => self.number(b, at),
            Mode::Lit(l, i) => {
                let lit = LITS[l as usize];
                if lit[i as usize] != b {
                    return false;
                }
                if i as usize + 1 == lit.len() {
                    self.value_end();
                } else {
                    self.mode = Mode::Lit(l, i + 1);
                }
                true
            }
            Mode::Done => ws(b),
        }
    }

    fn string(&mut self, b: u8, key: bool, esc: u8) -> bool {
        match string_byte(esc, b) {
            Some(StrByte::Close) if key => self.mode = Mode::Colon,
            Some(StrByte::Close) => self.value_end(),
            Some(StrByte::Next(esc)) => self.mode = Mode::Str { key, esc },
            None => return false,
        }
        true
    }

    fn number(&mut self, b: u8, at: u8) -> bool {
        let next = match (at, b) {
            (0, b'0') => 1,
            (0, b'1'..=b'9') | (2, b'0'..=b'9') => 2,
            (1 | 2, b'.') => 3,
            (3 | 4, b'0'..=b'9') => 4,
            (1 | 2 | 4, b'e' | b'E') => 5,
            (5, b'+' | b'-') => 6,
            // Two exponent digits at most: 1e99 is a finite double, 1e400 parses as none.
            (5 | 6, b'0'..=b'9') => 7,
            (7, b'0'..=b'9') => 8,
            // The number ended (after at least one digit): the byte belongs to what follows.
            (1 | 2 | 4 | 7 | 8, _) => {
                self.value_end();
                return self.mode != Mode::Done && self.feed(b);
            }
            _ => return false,
        };
        self.mode = Mode::Num(next);
        true
    }
}

/// What the reply must be: any JSON object, or a value valid against a schema.
#[derive(Debug, Clone)]
enum Grammar {
    Object(JsonState),
    Schema(Arc<Schema>, SchemaMachine),
}

/// The mask for one request: each token's bytes (special tokens never pass), and the state.
pub struct JsonMask {
    tokens: Arc<Vec<Option<Vec<u8>>>>,
    grammar: Grammar,
}

/// The bytes of tokens `0..vocab` (`None` for special and unused ids): built once, shared.
pub fn token_table(tok: &Tokenizer, vocab: usize) -> Arc<Vec<Option<Vec<u8>>>> {
    Arc::new(
        (0..vocab as u32)
            .map(|id| tok.special_text(id).is_none().then(|| tok.token_bytes(id)))
            .collect(),
    )
}

impl JsonMask {
    /// A mask at the start of a reply that must be one JSON object (`json_object`).
    pub fn new(tokens: Arc<Vec<Option<Vec<u8>>>>) -> Self {
        JsonMask {
            tokens,
            grammar: Grammar::Object(JsonState::default()),
        }
    }

    /// A mask at the start of a reply that must be valid against `schema` (`json_schema`).
    pub fn with_schema(tokens: Arc<Vec<Option<Vec<u8>>>>, schema: Arc<Schema>) -> Self {
        let m = SchemaMachine::new(&schema);
        JsonMask {
            tokens,
            grammar: Grammar::Schema(schema, m),
        }
    }

    /// Whether the reply's value is complete (the reply should end).
    pub fn done(&self) -> bool {
        match &self.grammar {
            Grammar::Object(s) => s.done(),
            Grammar::Schema(_, m) => m.done(),
        }
    }

    /// Whether `bytes` continue a valid reply from the current state (`scratch` is reused
    /// so that trying a token allocates nothing).
    fn accepts(&self, bytes: &[u8], scratch: &mut SchemaMachine) -> bool {
        // Inside a string, bytes that neither close nor escape keep the state as it is: the
        // common case in prose values, decided without a walk.
        let plain = |b: &u8| *b >= 0x20 && *b != b'"' && *b != b'\\';
        match &self.grammar {
            Grammar::Object(s) if s.plain_string() && bytes.iter().all(plain) => return true,
            Grammar::Schema(_, m) if m.plain_string() && bytes.iter().all(plain) => return true,
            _ => {}
        }
        match &self.grammar {
            Grammar::Object(s) => {
                let mut s = *s;
                bytes.iter().all(|&x| s.feed(x))
            }
            Grammar::Schema(schema, m) => {
                scratch.clone_from(m);
                bytes.iter().all(|&x| scratch.feed(schema, x))
            }
        }
    }

    /// Sets `-inf` on every token that cannot continue the reply (and, once it is complete,
    /// on every token). Each token's first byte is looked up in a table of the 256 bytes
    /// first, so that only tokens starting with an allowed byte are walked.
    pub fn apply(&self, logits: &mut [f32]) {
        let mut scratch = match &self.grammar {
            Grammar::Schema(_, m) => m.clone(),
            Grammar::Object(_) => SchemaMachine::empty(),
        };
        let mut first = [false; 256];
        for (b, f) in first.iter_mut().enumerate() {
            *f = self.accepts(&[b as u8], &mut scratch);
        }
        let done = self.done();
        for (l, t) in logits.iter_mut().zip(self.tokens.iter()) {
            let ok = !done
                && t.as_ref().is_some_and(|b| {
                    !b.is_empty()
                        && first[b[0] as usize]
                        && (b.len() == 1 || self.accepts(b, &mut scratch))
                });
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Feeds text as if chosen (tests: to put the mask in a state).
    #[cfg(test)]
    pub(crate) fn feed_text(&mut self, t: &[u8]) {
        let ok = match &mut self.grammar {
            Grammar::Object(s) => t.iter().all(|&x| s.feed(x)),
            Grammar::Schema(schema, m) => t.iter().all(|&x| m.feed(schema, x)),
        };
        assert!(ok, "{:?} refused", String::from_utf8_lossy(t));
    }

    /// Advances over the chosen token (special tokens leave the state as it is).
    pub fn advance(&mut self, id: u32) {
        let Some(Some(b)) = self.tokens.get(id as usize) else {
            return;
        };
        match &mut self.grammar {
            Grammar::Object(s) => b.iter().for_each(|&x| {
                s.feed(x);
            }),
            Grammar::Schema(schema, m) => b.iter().for_each(|&x| {
                m.feed(schema, x);
            }),
        }
    }
}

#[cfg(test)]
#[path = "json_mask_tests.rs"]
mod tests;
