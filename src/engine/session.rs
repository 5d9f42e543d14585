//! `Session`: one sequence on an `Engine`. It owns the sequence state, the tokens that state
//! holds, the one generated token not yet fed (a reply's last token is chosen but never run),
//! and the chat history. A chat turn feeds only what is new: the previous reply's last token,
//! the closing of that reply if a token limit cut it short, and the new messages rendered
//! without the preamble; the whole history is re-rendered only when the state cannot be
//! continued (after a prefill was cancelled part-way). Must not assemble stores or spines.

use std::sync::atomic::AtomicBool;

use super::Engine;
use crate::chat::{encode_marked, ChatOptions, Delta, Message, Phase};
use crate::runtime::generate::{GenerateOptions, Generation, Generator};
use crate::runtime::state::SeqState;
use crate::tokenizer::StreamDecoder;
use crate::Result;

/// What a chat turn produced.
#[derive(Debug, Clone)]
pub struct ChatTurn {
    /// The generation (prompt ids fed this turn, generated ids, stop reason, timings).
    pub generation: Generation,
    /// The reply's reasoning.
    pub reasoning: String,
    /// The reply's answer.
    pub content: String,
    /// The reply's tool calls (with tools in the session's `ChatOptions`).
    pub tool_calls: Vec<crate::chat::ToolCall>,
}

/// A session's saved position: restoring it continues from exactly here.
#[derive(Debug, Clone)]
pub struct SessionSnapshot {
    state: SeqState,
    fed: Vec<u32>,
    pending: Option<u32>,
    history: Vec<Message>,
    phase: Phase,
}

/// What a saved session holds besides its state and tokens.
#[derive(serde::Serialize, serde::Deserialize)]
struct Saved {
    pending: Option<u32>,
    history: Vec<Message>,
    phase: Phase,
}

/// One sequence on an engine.
pub struct Session<'e> {
    engine: &'e Engine,
    chat: ChatOptions,
    state: SeqState,
    /// The tokens `state` holds (`state.pos == fed.len()`).
    fed: Vec<u32>,
    /// The last generated token, chosen but not yet fed.
    pending: Option<u32>,
    history: Vec<Message>,
    /// Where the last reply ended.
    phase: Phase,
}

impl<'e> Session<'e> {
    pub(super) fn new(engine: &'e Engine, chat: ChatOptions) -> Self {
        Session {
            engine,
            chat,
            state: engine.model().new_state(),
            fed: Vec::new(),
            pending: None,
            history: Vec::new(),
            phase: Phase::Done,
        }
    }

    /// The tokens the sequence holds, the last generated one included.
    pub fn tokens(&self) -> Vec<u32> {
        self.fed.iter().copied().chain(self.pending).collect()
    }

    /// The chat history (every message of every turn).
    pub fn history(&self) -> &[Message] {
        &self.history
    }

    /// The sequence state (positions consumed, per-layer caches).
    pub fn state(&self) -> &SeqState {
        &self.state
    }

    /// Feeds `ids` (after the pending token, if any) and returns the last position's logits.
    pub fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        let input = self.take_input(ids);
        let logits = match self.engine.model().forward(&input, &mut self.state) {
            Ok(l) => l,
            Err(e) => {
                // The state may hold part of the input: start over rather than guess.
                self.reset_state();
                return Err(e);
            }
        };
        self.fed.extend_from_slice(&input);
        Ok(logits.to_vec1::<f32>()?)
    }

    /// Feeds one token and returns the next logits.
    pub fn step(&mut self, id: u32) -> Result<Vec<f32>> {
        self.prefill(&[id])
    }

    /// Continues the sequence with `ids` (after the pending token) and generates; `choose`
    /// picks each token from the logits. A fresh session starts from the engine's prompt cache
    /// when it has one.
    pub fn generate(
        &mut self,
        ids: &[u32],
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        choose: &mut dyn FnMut(&[f32]) -> u32,
        on_token: impl FnMut(u32),
    ) -> Result<Generation> {
        self.generate_marked(ids, &[], opts, cancel, choose, on_token)
    }

    /// `generate`, with the positions (in `ids`) where a later request may diverge: a fresh
    /// session cuts its prefill there and saves prompt-cache entries.
    fn generate_marked(
        &mut self,
        ids: &[u32],
        marks: &[usize],
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        choose: &mut dyn FnMut(&[f32]) -> u32,
        on_token: impl FnMut(u32),
    ) -> Result<Generation> {
        let pending = self.pending;
        let input = self.take_input(ids);
        let before = self.state.pos;
        let fresh = before == 0 && self.fed.is_empty();
        let g = if fresh && self.engine.prompt_cache().is_some() {
            let shift = input.len() - ids.len();
            let marks: Vec<usize> = marks.iter().map(|m| m + shift).collect();
            self.engine
                .generate(&input, &marks, opts, cancel, choose, on_token)
                .map(|(g, state)| {
                    if !(g.generated_ids.is_empty()
                        && g.stop == crate::runtime::generate::StopReason::Cancelled)
                    {
                        self.state = state;
                    }
                    g
                })
        } else {
            Generator::new(self.engine.model()).generate_drafted(
                &mut self.state,
                &input,
                opts,
                cancel,
                choose,
                &mut *self.engine.new_drafter(),
                on_token,
            )
        };
        let g = match g {
            Ok(g) => g,
            Err(e) => {
                self.reset_state();
                return Err(e);
            }
        };
        // A prefill stopped between layers left the state where it was: so is the session.
        if g.generated_ids.is_empty() && self.state.pos == before {
            self.pending = pending;
            return Ok(g);
        }
        // The state holds the input and every generated token but the last. If not, the
        // session starts over: the next chat turn re-renders the history.
        let mut held = input;
        held.extend_from_slice(&g.generated_ids[..g.generated_ids.len().saturating_sub(1)]);
        if !g.generated_ids.is_empty() && self.state.pos == before + held.len() {
            self.fed.extend(held);
            self.pending = g.generated_ids.last().copied();
        } else {
            self.reset_state();
        }
        Ok(g)
    }

    /// One chat turn: appends `messages` (usually one user message), generates the reply with
    /// `choose`, streams it to `on_delta` as reasoning and answer deltas, and appends it to the
    /// history. Only the new turn is fed when the session holds the conversation so far.
    pub fn chat_turn(
        &mut self,
        messages: &[Message],
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        choose: &mut dyn FnMut(&[f32]) -> u32,
        mut on_delta: impl FnMut(Delta),
    ) -> Result<ChatTurn> {
        let tok = self.engine.tokenizer();
        let format = self.engine.chat_format();
        let (history_len, phase) = (self.history.len(), self.phase);
        let fresh = self.fed.is_empty() && self.pending.is_none();
        if !format.continues() && !fresh {
            // The format renders the whole history each turn (see `ChatFormat::continues`).
            self.reset_state();
        }
        let (ids, marks) = if self.fed.is_empty() && self.pending.is_none() {
            self.history.extend_from_slice(messages);
            let (segs, marks) = format.render(&self.history, &self.chat)?;
            encode_marked(tok, &segs, &marks)
        } else {
            // The previous reply ended with its end-of-message token (still pending), or was
            // cut short: close it as the full rendering would, after its last token.
            let ids = format.continuation(
                tok,
                self.pending,
                self.engine.eos(),
                self.phase,
                messages,
                &self.chat,
            )?;
            self.history.extend_from_slice(messages);
            (ids, Vec::new())
        };
        let mut dec = StreamDecoder::new();
        let mut split = format.splitter(
            self.engine.tokenizer_arc(),
            self.chat.thinking,
            self.chat.calls_on(),
        )?;
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut calls = Vec::new();
        let mut emit = |d: Vec<Delta>, reasoning: &mut String, content: &mut String| {
            for x in d {
                match &x {
                    Delta::Reasoning(t) => reasoning.push_str(t),
                    Delta::Content(t) => content.push_str(t),
                    Delta::ToolCall(c) => calls.push(c.clone()),
                }
                on_delta(x);
            }
        };
        let g = self.generate_marked(&ids, &marks, opts, cancel, choose, |id| {
            emit(
                split.push_id(tok, &mut dec, id),
                &mut reasoning,
                &mut content,
            )
        })?;
        if g.generated_ids.is_empty() && g.stop == crate::runtime::generate::StopReason::Cancelled {
            // Cancelled before the first token: the turn never happened.
            self.history.truncate(history_len);
            self.phase = phase;
            return Ok(ChatTurn {
                generation: g,
                reasoning,
                content,
                tool_calls: calls,
            });
        }
        emit(split.finish(&mut dec), &mut reasoning, &mut content);
        self.phase = split.phase();
        let mut reply = Message::new("assistant", &content);
        reply.reasoning_content = Some(reasoning.clone());
        reply.tool_calls = calls.clone();
        self.history.push(reply);
        Ok(ChatTurn {
            generation: g,
            reasoning,
            content,
            tool_calls: calls,
        })
    }

    /// Saves the session's position (the state's buffers are shared copy-on-write).
    pub fn snapshot(&self) -> SessionSnapshot {
        SessionSnapshot {
            state: self.state.snapshot(),
            fed: self.fed.clone(),
            pending: self.pending,
            history: self.history.clone(),
            phase: self.phase,
        }
    }

    /// Returns to a saved position.
    pub fn restore(&mut self, s: &SessionSnapshot) {
        self.state = s.state.snapshot();
        self.fed = s.fed.clone();
        self.pending = s.pending;
        self.history = s.history.clone();
        self.phase = s.phase;
    }

    /// Writes the session (its state, tokens and chat history) to `path` atomically, for
    /// `Session::load`; returns the bytes written.
    pub fn save(&self, path: &std::path::Path) -> Result<u64> {
        let extra = serde_json::to_value(Saved {
            pending: self.pending,
            history: self.history.clone(),
            phase: self.phase,
        })
        .map_err(|e| crate::Error::Msg(e.to_string()))?;
        let fp = self.engine.fingerprint()?;
        crate::engine::prompt_cache::file::write(path, &fp, &self.fed, &self.state, None, extra)
    }

    /// A session read back from `path` (written by `save` for this checkpoint); a file from
    /// another checkpoint, format version or model shape is refused, a damaged one reported.
    pub fn load(engine: &'e Engine, chat: ChatOptions, path: &std::path::Path) -> Result<Self> {
        let fp = engine.fingerprint()?;
        let l = crate::engine::prompt_cache::file::read(path, &fp, &engine.model().new_state())?;
        let s: Saved =
            serde_json::from_value(l.header.extra).map_err(|e| crate::Error::StateFile {
                path: path.to_path_buf(),
                corrupt: false,
                msg: format!("not a saved session ({e})"),
            })?;
        Ok(Session {
            engine,
            chat,
            state: l.state,
            fed: l.header.ids,
            pending: s.pending,
            history: s.history,
            phase: s.phase,
        })
    }

    /// The pending token (if any) followed by `ids`: what the next pass feeds.
    fn take_input(&mut self, ids: &[u32]) -> Vec<u32> {
        self.pending
            .take()
            .into_iter()
            .chain(ids.iter().copied())
            .collect()
    }

    /// Drops the sequence state (the history stays): the next chat turn re-renders it all.
    fn reset_state(&mut self) {
        self.state = self.engine.model().new_state();
        self.fed.clear();
        self.pending = None;
        self.phase = Phase::Done;
    }
}
