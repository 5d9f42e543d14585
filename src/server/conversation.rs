//! The conversation cache: the tokens the last chat generation consumed and the sequence state
//! after them, so a request whose prompt extends them (the client sent the conversation back
//! with one more turn) prefills only the new tokens. One entry; the state's buffers are shared
//! copy-on-write. Knows nothing of HTTP or the queue.

use std::sync::Mutex;

use crate::SeqState;

/// The last chat's tokens and state.
#[derive(Default)]
pub(super) struct Conversation(Mutex<Option<(Vec<u32>, SeqState)>>);

impl Conversation {
    /// The saved state and how many tokens it holds, when `ids` strictly extends them.
    pub(super) fn resume(&self, ids: &[u32]) -> Option<(SeqState, usize)> {
        let saved = self.0.lock().ok()?.clone()?;
        let (seq, state) = saved;
        (ids.len() > seq.len() && ids.starts_with(&seq)).then_some((state, seq.len()))
    }

    /// Saves the tokens a state holds (replacing the previous entry).
    pub(super) fn save(&self, seq: Vec<u32>, state: SeqState) {
        if let Ok(mut l) = self.0.lock() {
            *l = Some((seq, state));
        }
    }
}
