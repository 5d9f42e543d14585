//! The dense tensor names the stores need to know of a model, as a value (`DenseNames`): the
//! wrapper a multimodal checkpoint puts the language model in, the token embedding, the tail
//! read once per pass after the last layer, and the name fragments whose 2-D BF16 tensors the
//! row-int8 conversion keeps. Layer tensors need no list: every tensor under
//! `model.layers.{l}.` that is not a routed expert belongs to layer `l` (the Hugging Face
//! convention). The default is K3's, defined with K3's other names in `models/k3/names.rs`;
//! another model sets its own on the inventory (`Inventory::with_names`).

use super::header::Dtype;

/// A model's dense tensor names (relative to the language model's prefix).
#[derive(Debug, Clone, PartialEq)]
pub struct DenseNames {
    /// Prefixes a multimodal checkpoint wraps the language model in; the inventory takes the
    /// one under which the embedding exists.
    pub wrappers: Vec<String>,
    /// Tensor-name prefixes of other towers (vision), skipped by the inventory.
    pub skipped: Vec<String>,
    /// The token embedding.
    pub embedding: String,
    /// The tensors after the last layer, in the order the tail reads them.
    pub tail: Vec<String>,
    /// Name fragments whose tensors stay BF16 in the row-int8 store.
    pub keep_bf16: Vec<String>,
}

impl DenseNames {
    /// Whether a tensor is converted to row-int8: every 2-D BF16 tensor except the kept kinds
    /// and the embedding.
    pub fn is_int8_target(&self, name: &str, dtype: Dtype, shape: &[usize]) -> bool {
        dtype == Dtype::BF16
            && shape.len() == 2
            && !self.keep_bf16.iter().any(|k| name.contains(k.as_str()))
            && !name.ends_with(self.embedding.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_targets_follow_the_models_names() {
        let names = DenseNames {
            wrappers: vec![],
            skipped: vec![],
            embedding: "tok.weight".into(),
            tail: vec!["head.weight".into()],
            keep_bf16: vec!["router".into()],
        };
        let m = [4, 8];
        assert!(names.is_int8_target("layers.0.q.weight", Dtype::BF16, &m));
        assert!(!names.is_int8_target("layers.0.router.weight", Dtype::BF16, &m));
        assert!(!names.is_int8_target("tok.weight", Dtype::BF16, &m));
        assert!(!names.is_int8_target("layers.0.q.weight", Dtype::F32, &m));
        assert!(!names.is_int8_target("layers.0.norm", Dtype::BF16, &[8]));
    }
}
