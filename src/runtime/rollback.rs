//! `Rollback`: what a verify pass (speculative decoding, `Forward::undo`) records so that any
//! prefix of its rows can be kept without reading weights again. Row caches keep a prefix by
//! truncating; a recurrent state keeps one through the family's own record (`RecurrentUndo`:
//! K3's KDA replays the kept rows' recurrence inputs). Owns the record's shape and its checks;
//! the recurrence itself is the family's.

use super::state::{LayerState, Recurrent, SeqState};
use crate::{Error, Result};

/// A family's record of one recurrent layer in a verify pass.
pub trait RecurrentUndo: Send + Sync + std::fmt::Debug {
    /// Returns `state` (holding the pass's row 0 only) to the state after rows `0..keep`.
    fn keep(&self, state: &mut Recurrent, keep: usize);

    /// Bytes the record holds.
    fn bytes(&self) -> usize;
}

/// One layer's undo record.
#[derive(Debug)]
pub enum LayerUndo {
    /// A row cache: its length before the pass.
    Rows(usize),
    /// A recurrent state: the family's record.
    Recurrent(Box<dyn RecurrentUndo>),
}

/// What a verify pass recorded: enough to keep any prefix of its positions.
#[derive(Debug)]
pub struct Rollback {
    /// Positions of the sequence before the pass.
    pub pos: usize,
    /// Positions in the pass.
    pub rows: usize,
    /// One record per layer.
    pub layers: Vec<LayerUndo>,
}

impl Rollback {
    /// The record of a pass over a state of row caches only (each layer's length before it).
    pub fn row_caches(pos: usize, rows: usize, lens: Vec<usize>) -> Rollback {
        Rollback {
            pos,
            rows,
            layers: lens.into_iter().map(LayerUndo::Rows).collect(),
        }
    }

    /// Positions the pass fed.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes the record holds (beyond the state itself).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerUndo::Recurrent(u) => u.bytes(),
                LayerUndo::Rows(_) => 0,
            })
            .sum()
    }

    /// Keeps the first `keep` positions of the pass in `state` (1 ≤ keep ≤ rows).
    pub fn keep(self, state: &mut SeqState, keep: usize) -> Result<()> {
        if keep == 0 || keep > self.rows || state.pos != self.pos + self.rows {
            return Err(Error::Msg(format!(
                "cannot keep {keep} of a verify pass of {} rows at position {} (state at {})",
                self.rows, self.pos, state.pos
            )));
        }
        if self.layers.len() != state.layers.len() {
            return Err(Error::Msg(
                "the verify record does not match the sequence state".into(),
            ));
        }
        for (u, st) in self.layers.iter().zip(&mut state.layers) {
            match (u, st) {
                (LayerUndo::Recurrent(u), LayerState::Recurrent(s)) => u.keep(s, keep),
                (LayerUndo::Rows(len), LayerState::Rows(c)) => c.truncate(len + keep),
                _ => {
                    return Err(Error::Msg(
                        "the verify record does not match the sequence state".into(),
                    ))
                }
            }
        }
        state.pos = self.pos + keep;
        Ok(())
    }
}
