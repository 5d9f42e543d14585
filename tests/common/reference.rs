//! An independent reference forward pass of K3 in f64, one token at a time, written as plainly
//! as possible from k3-spec.md §3. It shares nothing with the model code except weight loading.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use deltafin::checkpoint::{Dtype, ExpertIndex, Inventory};
use deltafin::models::k3::config::{AttnKind, FfnKind, K3Config};
use deltafin::spine::{to_f32, ShardSpine};

#[path = "reference_attn.rs"]
mod attn;

pub struct Reference {
    pub cfg: K3Config,
    prefix: String,
    w: HashMap<String, Vec<f64>>,
    experts: HashMap<(usize, usize), Vec<u8>>,
    state: Vec<LayerState>,
}

enum LayerState {
    Kda {
        hist: Vec<Vec<Vec<f64>>>,
        s: Vec<f64>,
    },
    Mla {
        k: Vec<Vec<f64>>,
        v: Vec<Vec<f64>>,
    },
}

const E2M1: [f64; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

fn matvec(w: &[f64], rows: usize, x: &[f64]) -> Vec<f64> {
    let cols = x.len();
    assert_eq!(w.len(), rows * cols);
    (0..rows)
        .map(|r| (0..cols).map(|c| w[r * cols + c] * x[c]).sum())
        .collect()
}

fn rmsnorm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| g * (v * inv)).collect()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn situ(g: f64, u: f64, b: f64, lb: f64) -> f64 {
    ((g / b).tanh() * b) * sigmoid(g) * ((u / lb).tanh() * lb)
}

fn mxfp4_matvec(packed: &[u8], scales: &[u8], rows: usize, cols: usize, x: &[f64]) -> Vec<f64> {
    (0..rows)
        .map(|r| {
            (0..cols)
                .map(|c| {
                    let b = packed[r * cols / 2 + c / 2];
                    let nib = if c % 2 == 0 { b & 15 } else { b >> 4 };
                    let s = scales[r * cols / 32 + c / 32] as i32;
                    let scale = if s == 0 { 0.0 } else { 2f64.powi(s - 127) };
                    E2M1[nib as usize] * scale * x[c]
                })
                .sum()
        })
        .collect()
}

impl Reference {
    pub fn load(dir: &Path) -> Reference {
        let cfg = K3Config::from_file(&dir.join("config.json")).unwrap();
        let inv = Arc::new(Inventory::from_dir(dir).unwrap());
        let spine = ShardSpine::new(inv.clone());
        let mut w = HashMap::new();
        for (name, t) in inv.iter() {
            if t.dtype != Dtype::U8 && !name.contains("embed_tokens") {
                let (b, d, _) = spine.bytes(name).unwrap();
                w.insert(
                    name.clone(),
                    to_f32(&b, d, name)
                        .unwrap()
                        .into_iter()
                        .map(|v| v as f64)
                        .collect(),
                );
            }
        }
        let emb = inv.name("model.embed_tokens.weight");
        let (b, d, _) = spine.bytes(&emb).unwrap();
        w.insert(
            emb,
            to_f32(&b, d, "embed")
                .unwrap()
                .into_iter()
                .map(|v| v as f64)
                .collect(),
        );
        // Expert bytes, each part read by name (not through the span logic).
        let index = ExpertIndex::derive_k3(&inv, &cfg).unwrap();
        let mut experts = HashMap::new();
        for l in cfg.moe_layers() {
            for e in 0..cfg.text().num_experts {
                let mut buf = Vec::new();
                for part in [
                    "w1.weight_packed",
                    "w1.weight_scale",
                    "w2.weight_packed",
                    "w2.weight_scale",
                    "w3.weight_packed",
                    "w3.weight_scale",
                ] {
                    let n = inv.layer_name(l, &format!("block_sparse_moe.experts.{e}.{part}"));
                    buf.extend(spine.bytes(&n).unwrap().0);
                }
                assert!(index.span(l, e).is_some());
                experts.insert((l, e), buf);
            }
        }
        let mut r = Reference {
            cfg,
            prefix: inv.prefix.clone(),
            w,
            experts,
            state: Vec::new(),
        };
        r.reset();
        r
    }

    pub fn reset(&mut self) {
        let t = self.cfg.text();
        let la = &t.linear_attn_config;
        let p = la.num_heads * la.head_dim;
        self.state = self
            .cfg
            .schedule
            .iter()
            .map(|k| match k.attn {
                AttnKind::Kda => LayerState::Kda {
                    hist: vec![vec![vec![0.0; p]; la.short_conv_kernel_size - 1]; 3],
                    s: vec![0.0; la.num_heads * la.head_dim * la.head_dim],
                },
                AttnKind::Mla => LayerState::Mla {
                    k: Vec::new(),
                    v: Vec::new(),
                },
            })
            .collect();
    }

    fn g(&self, l: usize, s: &str) -> &[f64] {
        let n = format!("{}model.layers.{l}.{s}", self.prefix);
        self.w.get(&n).unwrap_or_else(|| panic!("missing {n}"))
    }

    fn attn_res(&self, values: &[Vec<f64>], norm: &[f64], proj: &[f64]) -> Vec<f64> {
        let eps = self.cfg.text().rms_norm_eps;
        let scores: Vec<f64> = values
            .iter()
            .map(|v| {
                rmsnorm(v, norm, eps)
                    .iter()
                    .zip(proj)
                    .map(|(a, b)| a * b)
                    .sum()
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let z: f64 = e.iter().sum();
        let mut out = vec![0.0; values[0].len()];
        for (v, ei) in values.iter().zip(&e) {
            for (o, x) in out.iter_mut().zip(v) {
                *o += ei / z * x;
            }
        }
        out
    }

    fn mlp(&self, l: usize, pre: &str, inter: usize, x: &[f64]) -> Vec<f64> {
        let t = self.cfg.text();
        let g = matvec(self.g(l, &format!("{pre}.gate_proj.weight")), inter, x);
        let u = matvec(self.g(l, &format!("{pre}.up_proj.weight")), inter, x);
        let h: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(a, b)| {
                situ(
                    *a,
                    *b,
                    t.activation_situ_beta,
                    t.activation_situ_linear_beta,
                )
            })
            .collect();
        matvec(
            self.g(l, &format!("{pre}.down_proj.weight")),
            t.hidden_size,
            &h,
        )
    }

    fn moe(&self, l: usize, x: &[f64], routes: &mut Vec<(usize, Vec<usize>)>) -> Vec<f64> {
        let t = self.cfg.text();
        let (ne, k, r, inter) = (
            t.num_experts,
            t.num_experts_per_token,
            t.routed_expert_hidden_size,
            t.moe_intermediate_size,
        );
        let logits = matvec(self.g(l, "block_sparse_moe.gate.weight"), ne, x);
        let bias = self.g(l, "block_sparse_moe.gate.e_score_correction_bias");
        let s: Vec<f64> = logits.iter().map(|&v| sigmoid(v)).collect();
        let mut idx: Vec<usize> = (0..ne).collect();
        idx.sort_by(|&a, &b| {
            (s[b] + bias[b])
                .partial_cmp(&(s[a] + bias[a]))
                .unwrap()
                .then(a.cmp(&b))
        });
        idx.truncate(k);
        let sum: f64 = idx.iter().map(|&i| s[i]).sum::<f64>() + 1e-20;
        let z = matvec(
            self.g(l, "block_sparse_moe.routed_expert_down_proj.weight"),
            r,
            x,
        );
        let mut y = vec![0.0; r];
        for &e in &idx {
            let b = &self.experts[&(l, e)];
            let (p1, s1) = (inter * r / 2, inter * r / 32);
            let (w1p, rest) = b.split_at(p1);
            let (w1s, rest) = rest.split_at(s1);
            let (w2p, rest) = rest.split_at(p1);
            let (w2s, rest) = rest.split_at(s1);
            let (w3p, w3s) = rest.split_at(p1);
            let gg = mxfp4_matvec(w1p, w1s, inter, r, &z);
            let uu = mxfp4_matvec(w3p, w3s, inter, r, &z);
            let hh: Vec<f64> = gg
                .iter()
                .zip(&uu)
                .map(|(a, b)| {
                    situ(
                        *a,
                        *b,
                        t.activation_situ_beta,
                        t.activation_situ_linear_beta,
                    )
                })
                .collect();
            let ye = mxfp4_matvec(w2p, w2s, r, inter, &hh);
            for (yi, v) in y.iter_mut().zip(&ye) {
                *yi += s[e] / sum * v;
            }
        }
        routes.push((l, idx));
        let yn = rmsnorm(
            &y,
            self.g(l, "block_sparse_moe.routed_expert_norm.weight"),
            t.rms_norm_eps,
        );
        let routed = matvec(
            self.g(l, "block_sparse_moe.routed_expert_up_proj.weight"),
            t.hidden_size,
            &yn,
        );
        let shared = self.mlp(
            l,
            "block_sparse_moe.shared_experts",
            self.cfg.shared_width(),
            x,
        );
        routed.iter().zip(&shared).map(|(a, b)| a + b).collect()
    }

    /// One token: returns the logits and the routes `(layer, experts)` of every MoE layer.
    pub fn step(&mut self, id: u32) -> (Vec<f64>, Vec<(usize, Vec<usize>)>) {
        let t = self.cfg.text().clone();
        let hsz = t.hidden_size;
        let emb = &self.w[&format!("{}model.embed_tokens.weight", self.prefix)];
        let mut h = emb[id as usize * hsz..(id as usize + 1) * hsz].to_vec();
        let mut anchors: Vec<Vec<f64>> = Vec::new();
        let mut routes = Vec::new();
        for l in 0..self.cfg.num_layers() {
            let a_in = if anchors.is_empty() {
                h.clone()
            } else {
                let mut v = anchors.clone();
                v.push(h.clone());
                self.attn_res(
                    &v,
                    self.g(l, "self_attention_res_norm.weight"),
                    self.g(l, "self_attention_res_proj.weight"),
                )
            };
            let prefix = if l % t.attn_res_block_size == 0 {
                anchors.push(h.clone());
                None
            } else {
                Some(h.clone())
            };
            let x = rmsnorm(&a_in, self.g(l, "input_layernorm.weight"), t.rms_norm_eps);
            let o = match self.cfg.schedule[l].attn {
                AttnKind::Kda => self.kda(l, &x),
                AttnKind::Mla => self.mla(l, &x),
            };
            let p: Vec<f64> = match prefix {
                Some(pr) => pr.iter().zip(&o).map(|(a, b)| a + b).collect(),
                None => o,
            };
            let mut v = anchors.clone();
            v.push(p.clone());
            let m_in = self.attn_res(
                &v,
                self.g(l, "mlp_res_norm.weight"),
                self.g(l, "mlp_res_proj.weight"),
            );
            let xm = rmsnorm(
                &m_in,
                self.g(l, "post_attention_layernorm.weight"),
                t.rms_norm_eps,
            );
            let om = match self.cfg.schedule[l].ffn {
                FfnKind::Dense => self.mlp(l, "mlp", t.intermediate_size, &xm),
                FfnKind::Moe => self.moe(l, &xm, &mut routes),
            };
            h = p.iter().zip(&om).map(|(a, b)| a + b).collect();
        }
        let mut v = anchors.clone();
        v.push(h);
        let gname = |s: &str| format!("{}model.{s}", self.prefix);
        let f = self.attn_res(
            &v,
            &self.w[&gname("output_attn_res_norm.weight")],
            &self.w[&gname("output_attn_res_proj.weight")],
        );
        let fnorm = rmsnorm(&f, &self.w[&gname("norm.weight")], t.rms_norm_eps);
        let logits = matvec(
            &self.w[&format!("{}lm_head.weight", self.prefix)],
            t.vocab_size,
            &fnorm,
        );
        (logits, routes)
    }
}
