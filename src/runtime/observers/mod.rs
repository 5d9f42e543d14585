//! Observers any model's passes can carry (`runtime::observe::Observer`): the router trace
//! written as JSON lines (`trace`), the per-layer timing profile (`profile`) and the
//! token-to-token expert reuse count (`reuse`), the hidden-row tap (`tap`) and the splitter
//! that gives each sequence of a batched pass its own events (`split`). They read events only; no model math, no
//! family's types.

pub mod profile;
pub mod reuse;
pub mod split;
pub mod tap;
pub mod trace;

pub use profile::{LayerProfile, LayerTiming};
pub use reuse::ExpertReuse;
pub use split::{Part, PerSequence};
pub use tap::{HiddenTap, Tapped};
pub use trace::RouterTrace;
