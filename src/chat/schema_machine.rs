//! The byte walk over a compiled `Schema`: a stack of frames, one per open value, fed one
//! byte at a time; `feed` says whether some reply valid against the schema continues with the
//! byte. Owns the walk only; the vocabulary pass is `JsonMask`'s, the subset `json_schema`'s.

use super::json_mask::{string_byte, JsonState, StrByte};
use super::json_schema::{has, Node, Schema};

/// The most values open at once (object and array nesting, `$ref` recursion included).
const MAX_FRAMES: usize = 32;
/// Whitespace between tokens, as `JsonState` allows it: runs of 12 bytes, one line break.
const MAX_WS: u8 = 12;

/// Where one open value is.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Before the value: its first byte decides.
    Start,
    /// In a string; `esc` as in `JsonState` (0 plain, 1 after `\`, 2..=5 hex digits left + 1).
    Str { esc: u8 },
    /// In a number (`at` as in `JsonState`); `int`: no fraction or exponent; `n`: digits in
    /// the current part (capped, see `number`).
    Num { at: u8, int: bool, n: u8 },
    /// In one of exact encodings: those still matching, bytes matched.
    Lits { alive: u64, off: u16 },
    /// In a value of any shape.
    Any(JsonState),
    /// After `{` (`first`) or `,`: a key's `"`, or `}` when `first` and nothing required is left.
    Key { pos: u16, first: bool },
    /// In a key: the candidate properties still matching, bytes matched.
    KeyStr { alive: u64, off: u16 },
    /// After a key: `:`, then the value of property `prop`.
    Colon { prop: u16 },
    /// After a property's value: `,` or `}`; `pos` is the next property that may follow.
    ObjAfter { pos: u16 },
    /// After `[`: an item or `]`.
    ArrFirst,
    /// After `n` items' starts: `,` or `]`.
    ArrAfter { n: u32 },
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    node: u16,
    mode: Mode,
}

/// The walk's state (cloned per token tried; `clone_from` keeps the allocation).
#[derive(Debug, Clone)]
pub struct SchemaMachine {
    frames: Vec<Frame>,
    ws_run: u8,
    ws_nl: bool,
    done: bool,
}

fn ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The properties `pos..` that may come next: up to and including the first required one.
fn candidates(props: &[super::json_schema::Prop], pos: u16) -> u64 {
    let mut m = 0;
    for (i, p) in props.iter().enumerate().skip(pos as usize) {
        m |= 1 << i;
        if p.required {
            break;
        }
    }
    m
}

fn required_left(props: &[super::json_schema::Prop], pos: u16) -> bool {
    props.iter().skip(pos as usize).any(|p| p.required)
}

impl SchemaMachine {
    /// At the start of a reply to `schema`.
    pub fn new(schema: &Schema) -> Self {
        SchemaMachine {
            frames: vec![Frame {
                node: schema.root,
                mode: Mode::Start,
            }],
            ws_run: 0,
            ws_nl: false,
            done: false,
        }
    }

    /// A walk with nothing open (a scratch value to `clone_from` into).
    pub(crate) fn empty() -> Self {
        SchemaMachine {
            frames: Vec::new(),
            ws_run: 0,
            ws_nl: false,
            done: true,
        }
    }

    /// Whether the top value is inside a string, not in an escape (an embedded any-value
    /// included).
    pub(crate) fn plain_string(&self) -> bool {
        match self.frames.last().map(|f| f.mode) {
            Some(Mode::Str { esc: 0 }) => true,
            Some(Mode::Any(j)) => j.plain_string(),
            _ => false,
        }
    }

    /// Whether the root value is complete.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Feeds one byte; `false` (state unspecified) when no valid reply continues with it.
    pub fn feed(&mut self, s: &Schema, b: u8) -> bool {
        let Some(top) = self.frames.last().copied() else {
            return false;
        };
        let between = matches!(
            top.mode,
            Mode::Start
                | Mode::Key { .. }
                | Mode::Colon { .. }
                | Mode::ObjAfter { .. }
                | Mode::ArrFirst
                | Mode::ArrAfter { .. }
        );
        if between && ws(b) {
            // The reply opens with the value; whitespace runs between tokens stay short.
            let nl = b == b'\n' || b == b'\r';
            if self.frames.len() == 1 && matches!(top.mode, Mode::Start)
                || self.ws_run >= MAX_WS
                || (nl && self.ws_nl)
            {
                return false;
            }
            self.ws_run += 1;
            self.ws_nl |= nl;
            return true;
        }
        (self.ws_run, self.ws_nl) = (0, false);
        self.step(s, b)
    }

    /// The value on top is complete: back to its container (or done).
    fn pop(&mut self) {
        self.frames.pop();
        self.done = self.frames.is_empty();
    }

    fn set(&mut self, mode: Mode) {
        if let Some(f) = self.frames.last_mut() {
            f.mode = mode;
        }
    }

    /// Opens a value of `node` in the current frame's place, its first byte to come.
    fn push(&mut self, node: u16) -> bool {
        if self.frames.len() >= MAX_FRAMES {
            return false;
        }
        self.frames.push(Frame {
            node,
            mode: Mode::Start,
        });
        true
    }

    /// A byte (not whitespace between tokens) for the top frame; a value that ends only at
    /// the next byte (a number) hands the byte back to its container.
    fn step(&mut self, s: &Schema, b: u8) -> bool {
        {
            let Some(Frame { node, mode }) = self.frames.last().copied() else {
                return false;
            };
            let n = &s.nodes[node as usize];
            let handed_back = match mode {
                Mode::Start => return self.start(s, node, b),
                Mode::Str { esc } => return self.string(b, esc),
                Mode::Num { at, int, n } => match number(at, int, n, b) {
                    Some((at, n)) => {
                        self.set(Mode::Num { at, int, n });
                        return true;
                    }
                    None => matches!(at, 1 | 2 | 4 | 7),
                },
                Mode::Lits { alive, off } => match self.lits(n, alive, off, b) {
                    Some(ok) => return ok,
                    None => true,
                },
                Mode::Any(mut j) => {
                    let before = j;
                    if j.feed(b) {
                        if j.done() {
                            self.pop();
                        } else {
                            self.set(Mode::Any(j));
                        }
                        return true;
                    }
                    before.number_complete()
                }
                _ => return self.container(s, n, mode, b),
            };
            if !handed_back {
                return false;
            }
            self.pop();
        }
        self.feed(s, b)
    }

    fn start(&mut self, s: &Schema, node: u16, b: u8) -> bool {
        let mode = match &s.nodes[node as usize] {
            Node::String if b == b'"' => Mode::Str { esc: 0 },
            Node::Integer | Node::Number => {
                let int = matches!(s.nodes[node as usize], Node::Integer);
                let at = match b {
                    b'-' => 0,
                    b'0' => 1,
                    b'1'..=b'9' => 2,
                    _ => return false,
                };
                Mode::Num {
                    at,
                    int,
                    n: (at > 0) as u8,
                }
            }
            Node::Lits(_) => {
                self.set(Mode::Lits {
                    alive: u64::MAX,
                    off: 0,
                });
                return self.lits(&s.nodes[node as usize], u64::MAX, 0, b) == Some(true);
            }
            Node::Any | Node::AnyObject => {
                let mut j = if matches!(s.nodes[node as usize], Node::Any) {
                    JsonState::any_value()
                } else {
                    JsonState::default()
                };
                if !j.feed(b) {
                    return false;
                }
                Mode::Any(j)
            }
            Node::Object(_) if b == b'{' => Mode::Key {
                pos: 0,
                first: true,
            },
            Node::Array { .. } if b == b'[' => Mode::ArrFirst,
            Node::OneOf(branches) => {
                let Some(&br) = branches.iter().find(|&&x| has(&s.first(x), b)) else {
                    return false;
                };
                if let Some(f) = self.frames.last_mut() {
                    f.node = br;
                }
                return self.start(s, br, b);
            }
            _ => return false,
        };
        self.set(mode);
        true
    }

    fn string(&mut self, b: u8, esc: u8) -> bool {
        match string_byte(esc, b) {
            Some(StrByte::Close) => self.pop(),
            Some(StrByte::Next(esc)) => self.set(Mode::Str { esc }),
            None => return false,
        }
        true
    }

    /// `Some(ok)`: the byte was taken (or refused); `None`: an encoding was complete and the
    /// byte belongs to the container.
    fn lits(&mut self, n: &Node, alive: u64, off: u16, b: u8) -> Option<bool> {
        let Node::Lits(l) = n else { return Some(false) };
        let o = off as usize;
        let (mut next, mut complete, mut longer) = (0u64, false, false);
        for (i, e) in l.iter().enumerate().filter(|(i, _)| alive >> i & 1 == 1) {
            complete |= e.len() == o;
            if e.get(o) == Some(&b) {
                next |= 1 << i;
                longer |= e.len() > o + 1;
            }
        }
        if next == 0 {
            return if complete { None } else { Some(false) };
        }
        if longer {
            self.set(Mode::Lits {
                alive: next,
                off: off + 1,
            });
        } else {
            self.pop();
        }
        Some(true)
    }

    fn container(&mut self, s: &Schema, n: &Node, mode: Mode, b: u8) -> bool {
        match (n, mode) {
            (Node::Object(p), Mode::Key { pos, first }) => match b {
                b'"' if (pos as usize) < p.len() => {
                    self.set(Mode::KeyStr {
                        alive: candidates(p, pos),
                        off: 1,
                    });
                    true
                }
                b'}' if first && !required_left(p, pos) => {
                    self.pop();
                    true
                }
                _ => false,
            },
            (Node::Object(p), Mode::KeyStr { alive, off }) => {
                let o = off as usize;
                let mut next = 0u64;
                let mut matched = None;
                for (i, k) in p.iter().enumerate().filter(|(i, _)| alive >> i & 1 == 1) {
                    if k.key.get(o) == Some(&b) {
                        next |= 1 << i;
                        if k.key.len() == o + 1 {
                            matched = Some(i as u16);
                        }
                    }
                }
                match (next, matched) {
                    (0, _) => return false,
                    (_, Some(prop)) => self.set(Mode::Colon { prop }),
                    _ => self.set(Mode::KeyStr {
                        alive: next,
                        off: off + 1,
                    }),
                }
                true
            }
            (Node::Object(p), Mode::Colon { prop }) if b == b':' => {
                self.set(Mode::ObjAfter { pos: prop + 1 });
                self.push(p[prop as usize].node)
            }
            (Node::Object(p), Mode::ObjAfter { pos }) => match b {
                b',' if (pos as usize) < p.len() => {
                    self.set(Mode::Key { pos, first: false });
                    true
                }
                b'}' if !required_left(p, pos) => {
                    self.pop();
                    true
                }
                _ => false,
            },
            (&Node::Array { items, min, .. }, Mode::ArrFirst) => match b {
                b']' if min == 0 => {
                    self.pop();
                    true
                }
                _ => {
                    self.set(Mode::ArrAfter { n: 1 });
                    self.push(items) && self.step(s, b)
                }
            },
            (&Node::Array { items, min, max }, Mode::ArrAfter { n }) => match b {
                b',' if n < max => {
                    self.set(Mode::ArrAfter { n: n + 1 });
                    self.push(items)
                }
                b']' if n >= min => {
                    self.pop();
                    true
                }
                _ => false,
            },
            _ => false,
        }
    }
}

/// Digits an integer may have: it fits 64 bits (10^18 - 1), so that every client's parser
/// reads it as an integer.
const INT_DIGITS: u8 = 18;
/// Digits an exponent may have: 1e99 is a finite double (1e400 would not parse as one).
const EXP_DIGITS: u8 = 2;

/// The next number state and digit count after byte `b` (`at` as in `JsonState`, `n` digits
/// in the current part), `None` when `b` does not continue the number.
fn number(at: u8, int: bool, n: u8, b: u8) -> Option<(u8, u8)> {
    Some(match (at, b) {
        (0, b'0') => (1, 1),
        (0, b'1'..=b'9') => (2, 1),
        (2, b'0'..=b'9') if !int || n < INT_DIGITS => (2, n + 1),
        (1 | 2, b'.') if !int => (3, 0),
        (3 | 4, b'0'..=b'9') => (4, n + 1),
        (1 | 2 | 4, b'e' | b'E') if !int => (5, 0),
        (5, b'+' | b'-') => (6, 0),
        (5..=7, b'0'..=b'9') if n < EXP_DIGITS => (7, n + 1),
        _ => return None,
    })
}
