//! `PerSequence`: hands each sequence of a batched pass its own view of the pass, for
//! observers that follow one sequence (a drafter's `HiddenTap`): its own `PassStart` (its
//! first position and row count) and its own rows of each `LayerDone` (a batched pass holds
//! every sequence's rows one after the other). Other events are not forwarded. Owns the
//! slicing; never changes a pass.

use crate::runtime::observe::{Event, Observer, Rows};

/// One sequence's part of a batched pass.
pub struct Part<'a> {
    /// Its first position in its own sequence.
    pub first_pos: usize,
    /// Its rows in the pass.
    pub rows: usize,
    /// What watches it (none: its rows are skipped).
    pub observer: Option<&'a dyn Observer>,
}

/// Splits a batched pass's events by sequence (parts in the pass's row order).
pub struct PerSequence<'a> {
    /// The sequences, in row order.
    pub parts: Vec<Part<'a>>,
}

impl PerSequence<'_> {
    /// Whether any part is watched (else the pass needs no observer).
    pub fn any(&self) -> bool {
        self.parts.iter().any(|p| p.observer.is_some())
    }
}

impl Observer for PerSequence<'_> {
    fn on(&self, layer: usize, event: &Event<'_>) {
        match event {
            Event::PassStart { .. } => {
                for p in &self.parts {
                    if let Some(o) = p.observer {
                        let e = Event::PassStart {
                            first_pos: p.first_pos,
                            tokens: p.rows,
                        };
                        o.on(layer, &e);
                    }
                }
            }
            Event::LayerDone(rows) => {
                let mut at = 0;
                for p in &self.parts {
                    if let Some(o) = p.observer {
                        match rows {
                            Rows::Tensor(t) => match t.narrow(0, at, p.rows) {
                                Ok(t) => o.on(layer, &Event::LayerDone(Rows::Tensor(&t))),
                                Err(e) => tracing::warn!("per-sequence rows: {e}"),
                            },
                            Rows::Host { data, width } => {
                                let part = data.get(at * width..(at + p.rows) * width);
                                if let Some(data) = part {
                                    let r = Rows::Host {
                                        data,
                                        width: *width,
                                    };
                                    o.on(layer, &Event::LayerDone(r));
                                }
                            }
                        }
                    }
                    at += p.rows;
                }
            }
            _ => {}
        }
    }
}
