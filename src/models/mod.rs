//! The models that run on the runtime. Each model's tensor names, config and modules live in
//! its own folder; the runtime (`moe`, `experts`, `spine`, `compute`, `mxfp4`, `engine`) takes
//! names and layouts as values.

pub mod k3;
