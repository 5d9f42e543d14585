//! `response_format: {"type": "json_object"}` kept by a mask over the vocabulary: a byte-level
//! JSON recognizer (one top-level object, nesting to 64) is run over each token's bytes from
//! the current state, and tokens that cannot continue a valid object get `-inf` before the
//! chooser sees the logits. Once the object closes, only the end of the reply is allowed.
//! Written here because the cost is one pass over the vocabulary's bytes per token (measured in
//! README, "response_format"), far below a decode step; knows nothing of the model or HTTP.

use crate::tokenizer::Tokenizer;

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
    /// `.`, 4 in the fraction, 5 after `e`, 6 after the exponent's sign, 7 in its digits.
    Num(u8),
    /// In `true`/`false`/`null`: the literal and the bytes matched.
    Lit(u8, u8),
    /// The top-level object closed.
    Done,
}

const LITS: [&[u8]; 3] = [b"true", b"false", b"null"];

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
        let next = match (esc, b) {
            (0, b'"') => {
                if key {
                    self.mode = Mode::Colon;
                } else {
                    self.value_end();
                }
                return true;
            }
            (0, b'\\') => 1,
            (0, 0..=0x1f) => return false,
            (0, _) => 0,
            (1, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => 0,
            (1, b'u') => 5,
            (2..=5, _) if b.is_ascii_hexdigit() => {
                if esc == 2 {
                    0
                } else {
                    esc - 1
                }
            }
            _ => return false,
        };
        self.mode = Mode::Str { key, esc: next };
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
            (5..=7, b'0'..=b'9') => 7,
            // The number ended (after at least one digit): the byte belongs to what follows.
            (1 | 2 | 4 | 7, _) => {
                self.value_end();
                return self.mode != Mode::Done && self.feed(b);
            }
            _ => return false,
        };
        self.mode = Mode::Num(next);
        true
    }
}

/// The mask for one request: each token's bytes (special tokens never pass), and the state.
pub struct JsonMask {
    tokens: std::sync::Arc<Vec<Option<Vec<u8>>>>,
    state: JsonState,
}

/// The bytes of tokens `0..vocab` (`None` for special and unused ids): built once, shared.
pub fn token_table(tok: &Tokenizer, vocab: usize) -> std::sync::Arc<Vec<Option<Vec<u8>>>> {
    std::sync::Arc::new(
        (0..vocab as u32)
            .map(|id| tok.special_text(id).is_none().then(|| tok.token_bytes(id)))
            .collect(),
    )
}

impl JsonMask {
    /// A mask at the start of a reply.
    pub fn new(tokens: std::sync::Arc<Vec<Option<Vec<u8>>>>) -> Self {
        JsonMask {
            tokens,
            state: JsonState::default(),
        }
    }

    /// Whether the object is complete (the reply should end).
    pub fn done(&self) -> bool {
        self.state.done()
    }

    /// Sets `-inf` on every token that cannot continue the object (and, once it is complete,
    /// on every token).
    pub fn apply(&self, logits: &mut [f32]) {
        for (l, t) in logits.iter_mut().zip(self.tokens.iter()) {
            let ok = !self.state.done()
                && t.as_ref().is_some_and(|b| {
                    let mut s = self.state;
                    !b.is_empty() && b.iter().all(|&x| s.feed(x))
                });
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Advances over the chosen token (special tokens leave the state as it is).
    pub fn advance(&mut self, id: u32) {
        if let Some(Some(b)) = self.tokens.get(id as usize) {
            for &x in b {
                self.state.feed(x);
            }
        }
    }
}

#[cfg(test)]
#[path = "json_mask_tests.rs"]
mod tests;
