//! How a caller asks `K3Model::run` for a pass (`Forward`, `Logits`) and what it gets back
//! (`Output`), and the one-call conveniences over `run` (forward, forward_traced, forward_with,
//! forward_all, verify). It holds no math: every pass goes through `run`.

use candle::Tensor;

use super::model::K3Model;
use crate::runtime::observe::{Observer, RouteCollector, RouteTrace};
use crate::runtime::state::SeqState;
use crate::Result;

use crate::runtime::model::Forward;

impl K3Model {
    /// `run` for the last position's logits `[V]` (a convenience).
    pub fn forward(&self, ids: &[u32], state: &mut SeqState) -> Result<Tensor> {
        self.forward_traced(ids, state, None)
    }

    /// `forward`, recording the routes of every MoE layer (a convenience over `run`).
    pub fn forward_traced(
        &self,
        ids: &[u32],
        state: &mut SeqState,
        trace: Option<&mut RouteTrace>,
    ) -> Result<Tensor> {
        let routes = RouteCollector::default();
        let observer = trace.as_ref().map(|_| &routes as &dyn Observer);
        let logits = self
            .forward_with(ids, state, observer, None)?
            .ok_or_else(|| crate::Error::Msg("forward was cancelled".into()))?;
        if let Some(t) = trace {
            t.extend(routes.take());
        }
        Ok(logits)
    }

    /// `run` for the last position's logits with an observer and a cancel flag (a convenience).
    pub fn forward_with(
        &self,
        ids: &[u32],
        state: &mut SeqState,
        observer: Option<&dyn Observer>,
        cancel: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<Option<Tensor>> {
        let f = Forward {
            observer,
            cancel,
            ..Default::default()
        };
        Ok(self.run(ids, state, &f)?.map(|o| o.logits))
    }

    /// `run` for the logits `[T, V]` of every position (teacher-forced evaluation; a
    /// convenience).
    pub fn forward_all(&self, ids: &[u32], state: &mut SeqState) -> Result<Tensor> {
        (self as &dyn crate::runtime::model::Model).forward_all(ids, state)
    }

    /// `run` as a verify pass (speculative decoding): the logits `[T, V]` of every position
    /// and the record that keeps any prefix of them (`Rollback::keep`); a convenience.
    pub fn verify(
        &self,
        ids: &[u32],
        state: &mut SeqState,
        observer: Option<&dyn Observer>,
    ) -> Result<(Tensor, crate::runtime::rollback::Rollback)> {
        self.check_input(ids, state)?;
        let f = Forward {
            observer,
            undo: true,
            ..Default::default()
        };
        let out = self.run_verify(ids, state, &f)?;
        let rb = out
            .rollback
            .ok_or_else(|| crate::Error::Msg("verify kept no record".into()))?;
        Ok((out.logits, rb))
    }
}
