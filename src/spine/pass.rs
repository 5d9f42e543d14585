//! A forward pass over the spine (`Spine::pass`, `Pass`): streamed layers read ahead in layer
//! order by a loader thread, or, with one layer in flight (a tight memory plan), read or mapped
//! when the model asks for each. A child of `source`, whose `Spine` it reads; owns no layer
//! data beyond what it hands out.

use std::sync::mpsc::{sync_channel, Receiver};

use super::{LayerData, LayerRef, Spine};
use crate::{Error, Result};

impl Spine {
    /// Starts a forward pass: streamed layers are read ahead in layer order, or, with one
    /// layer in flight (a tight memory plan), each when it is asked for.
    pub fn pass(&self) -> Pass<'_> {
        let streamed: Vec<usize> = (0..self.pinned.len())
            .filter(|&l| self.pinned[l].is_none())
            .collect();
        if streamed.is_empty() || self.in_flight <= 1 {
            return Pass {
                spine: self,
                rx: None,
                thread: None,
            };
        }
        let (tx, rx) = sync_channel(self.in_flight.saturating_sub(2));
        let inner = self.inner.clone();
        let cap = self.stream_cap;
        let thread = std::thread::Builder::new()
            .name("spine-loader".into())
            .spawn(move || {
                for l in streamed {
                    if tx.send((l, inner.load(l, &inner.pool, cap))).is_err() {
                        return;
                    }
                }
            })
            .ok();
        Pass {
            spine: self,
            rx: Some(rx),
            thread,
        }
    }
}

/// One forward pass over the layers.
pub struct Pass<'a> {
    spine: &'a Spine,
    rx: Option<Receiver<(usize, Result<LayerData>)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pass<'_> {
    /// Layer `l`'s data; streamed layers must be asked for in layer order.
    pub fn layer(&mut self, l: usize) -> Result<LayerRef> {
        if let Some(Some(p)) = self.spine.pinned.get(l) {
            return Ok(LayerRef::Pinned(p.clone()));
        }
        let Some(rx) = self.rx.as_ref() else {
            // One layer in flight: read now, into the pool's one buffer (the caller has
            // dropped the previous layer).
            let s = self.spine;
            if l >= s.pinned.len() {
                return Err(Error::Msg(format!("layer {l} is not available")));
            }
            return s.streamed(l, s.inner.load(l, &s.inner.pool, s.stream_cap));
        };
        let (got, data) = rx
            .recv()
            .map_err(|_| Error::Msg("the spine loader stopped".into()))?;
        if got != l {
            return Err(Error::Msg(format!(
                "spine loader delivered layer {got}, the model asked for {l}"
            )));
        }
        self.spine.streamed(l, data)
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.rx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
