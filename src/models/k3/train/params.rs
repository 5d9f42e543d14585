//! The trainer's parameters and K3's tensors, both ways: a seeded initialisation, reading a K3
//! checkpoint directory back (BF16/F32 exactly, MXFP4 experts dequantised: what the inference
//! path computes with), and the bytes of every tensor for export (spine to BF16/F32, experts
//! quantised to MXFP4). The tensor list and order are `checkpoint::fixture::model_units`', the
//! same any K3-format writer uses; this module must not define names of its own beyond the
//! stacked experts.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle::{DType, Device, Tensor, Var};
use half::bf16;

use super::net::Net;
use crate::checkpoint::header::Dtype;
use crate::checkpoint::rng::Rng;
use crate::models::k3::config::K3Config;
use crate::models::k3::fixture::{model_units, Init, Spec};
use crate::mxfp4::format::{dequantize, quantize, Mxfp4Matrix};
use crate::{Error, Result};

const PREFIX: &str = "language_model.";

/// `(layer, matrix)` when `name` is a routed-expert tensor: `…layers.{l}.block_sparse_moe.experts.{e}.{w}.{part}`.
fn expert_part(name: &str) -> Option<(usize, usize, &str, &str)> {
    let rest = name.strip_prefix("language_model.model.layers.")?;
    let (l, rest) = rest.split_once('.')?;
    let rest = rest.strip_prefix("block_sparse_moe.experts.")?;
    let (e, rest) = rest.split_once('.')?;
    let (w, part) = rest.split_once('.')?;
    Some((l.parse().ok()?, e.parse().ok()?, w, part))
}

/// The stacked expert parameter of layer `l`, matrix `w` (`w1`, `w2`, `w3`).
pub fn stacked_name(l: usize, w: &str) -> String {
    format!("language_model.model.layers.{l}.block_sparse_moe.experts.{w}")
}

fn is_bias(name: &str) -> bool {
    name.ends_with("e_score_correction_bias")
}

fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("language_model.model.layers.")?
        .split_once('.')?
        .0
        .parse()
        .ok()
}

/// The spine tensors (not experts, not vision) of `cfg`, in file order.
fn spine_specs(cfg: &K3Config) -> Vec<Spec> {
    model_units(cfg, PREFIX, true, false)
        .into_iter()
        .flatten()
        .filter(|s| s.name.starts_with(PREFIX) && expert_part(&s.name).is_none())
        .collect()
}

/// Initial values of a spine tensor, by its role.
fn init_values(s: &Spec, rng: &mut Rng) -> Vec<f32> {
    let n: usize = s.shape.iter().product();
    let fan_in = *s.shape.last().unwrap_or(&1) as f64;
    let normal = |rng: &mut Rng, std: f64| (0..n).map(|_| (rng.normal() * std) as f32).collect();
    let name = s.name.as_str();
    if name.ends_with("embed_tokens.weight") {
        normal(rng, 1.0)
    } else if name.ends_with("_res_proj.weight") || is_bias(name) {
        // Zero pseudo-queries: AttnRes starts as the mean over depth.
        vec![0.0; n]
    } else if name.ends_with("norm.weight") {
        vec![1.0; n]
    } else if name.ends_with("A_log") {
        // One value per head, zero-padded to head_dim as K3 stores it (the padding is never
        // read, so it gets no gradient and stays zero).
        let heads = match s.init {
            Init::PerHead(h, ..) => h,
            _ => n,
        };
        (0..n)
            .map(|i| match i < heads {
                true => (1.0 + 15.0 * rng.uniform()).ln() as f32,
                false => 0.0,
            })
            .collect()
    } else if name.ends_with("dt_bias") {
        // Slow and fast channels: decays from about e^-1.3 to about 1 per step at the start.
        (0..n).map(|_| -(rng.uniform() as f32)).collect()
    } else if name.ends_with("conv1d.weight") {
        (0..n).map(|_| (rng.uniform() - 0.5) as f32).collect()
    } else if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
        normal(rng, 0.5 / fan_in.sqrt())
    } else {
        normal(rng, 1.0 / fan_in.sqrt())
    }
}

impl Net {
    /// A freshly initialised network for `cfg`, every value from `seed`.
    pub fn init(cfg: &K3Config, seed: u64, device: &Device) -> Result<Net> {
        crate::models::k3::fixture::check_a_log_padding(cfg)?;
        let mut rng = Rng::new(seed);
        let mut values: Vec<(String, Vec<usize>, Vec<f32>)> = spine_specs(cfg)
            .iter()
            .map(|s| (s.name.clone(), s.shape.clone(), init_values(s, &mut rng)))
            .collect();
        let t = cfg.text();
        let shapes = cfg.expert_matrix_shapes();
        for l in cfg.moe_layers() {
            for (m, &(rows, cols)) in shapes.iter().enumerate() {
                let n = t.num_experts * rows * cols;
                let std = 1.0 / (cols as f64).sqrt();
                let v = (0..n).map(|_| (rng.normal() * std) as f32).collect();
                values.push((
                    stacked_name(l, ["w1", "w2", "w3"][m]),
                    vec![t.num_experts, rows, cols],
                    v,
                ));
            }
        }
        Net::from_values(cfg, values, device)
    }

    fn from_values(
        cfg: &K3Config,
        values: Vec<(String, Vec<usize>, Vec<f32>)>,
        device: &Device,
    ) -> Result<Net> {
        let mut vars = BTreeMap::new();
        let mut biases = BTreeMap::new();
        for (name, shape, v) in values {
            let t = Tensor::from_vec(v, shape, device)?;
            if is_bias(&name) {
                let l = layer_of(&name).ok_or_else(|| Error::Msg(format!("bad name {name}")))?;
                biases.insert(l, t);
            } else {
                vars.insert(name, Var::from_tensor(&t)?);
            }
        }
        Ok(Net {
            cfg: cfg.clone(),
            vars,
            biases,
        })
    }

    /// Named f32 values of every parameter and bias (for trainer checkpoints).
    pub fn named_values(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out: Vec<(String, Tensor)> = self
            .vars
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect();
        for (l, b) in &self.biases {
            let name =
                format!("{PREFIX}model.layers.{l}.block_sparse_moe.gate.e_score_correction_bias");
            out.push((name, b.clone()));
        }
        Ok(out)
    }

    /// Replaces every parameter and bias with the values in `named` (a trainer checkpoint).
    pub fn load_values(&mut self, named: &HashMap<String, Tensor>) -> Result<()> {
        let device = self.device();
        for (name, var) in &self.vars {
            let t = named
                .get(name)
                .ok_or_else(|| Error::Msg(format!("the checkpoint has no `{name}`")))?;
            if t.dims() != var.dims() {
                return Err(Error::Msg(format!(
                    "`{name}` is {:?} in the checkpoint, {:?} in the model",
                    t.dims(),
                    var.dims()
                )));
            }
            var.set(&t.to_dtype(DType::F32)?.to_device(&device)?)?;
        }
        for (l, b) in self.biases.iter_mut() {
            let name =
                format!("{PREFIX}model.layers.{l}.block_sparse_moe.gate.e_score_correction_bias");
            let t = named
                .get(&name)
                .ok_or_else(|| Error::Msg(format!("the checkpoint has no `{name}`")))?;
            *b = t.to_dtype(DType::F32)?.to_device(&device)?;
        }
        Ok(())
    }

    /// The trainer's fp32 network from its checkpoint file (`deltafin train --work`'s
    /// `weights.safetensors`) for the model `cfg`.
    pub fn from_checkpoint(cfg: &K3Config, path: &Path) -> Result<Net> {
        let mut net = Net::init(cfg, 0, &Device::Cpu)?;
        let named: HashMap<String, Tensor> = candle::safetensors::load(path, &Device::Cpu)
            .map_err(|e| Error::Msg(format!("{}: {e}", path.display())))?;
        net.load_values(&named)?;
        Ok(net)
    }

    /// The network a K3 checkpoint in `dir` holds, as the inference path sees it (BF16 expanded
    /// exactly, experts dequantised from MXFP4).
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Net> {
        let cfg = K3Config::from_file(&dir.join("config.json"))?;
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for shard in crate::checkpoint::inventory::discover_shards(dir)? {
            let path = dir.join(&shard);
            let map = candle::safetensors::load(&path, &Device::Cpu)
                .map_err(|e| Error::Msg(format!("{}: {e}", path.display())))?;
            tensors.extend(map);
        }
        let get = |name: &str| -> Result<&Tensor> {
            tensors
                .get(name)
                .ok_or_else(|| Error::Msg(format!("{}: no tensor `{name}`", dir.display())))
        };
        let mut values = Vec::new();
        for s in spine_specs(&cfg) {
            let v = get(&s.name)?
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1()?;
            values.push((s.name, s.shape, v));
        }
        let t = cfg.text();
        let shapes = cfg.expert_matrix_shapes();
        for l in cfg.moe_layers() {
            for (m, &(rows, cols)) in shapes.iter().enumerate() {
                let w = ["w1", "w2", "w3"][m];
                let mut all = Vec::with_capacity(t.num_experts * rows * cols);
                for e in 0..t.num_experts {
                    let base = format!("{PREFIX}model.layers.{l}.block_sparse_moe.experts.{e}.{w}");
                    let packed: Vec<u8> = get(&format!("{base}.weight_packed"))?
                        .flatten_all()?
                        .to_vec1()?;
                    let scales: Vec<u8> = get(&format!("{base}.weight_scale"))?
                        .flatten_all()?
                        .to_vec1()?;
                    all.extend(dequantize(&Mxfp4Matrix::new(&packed, &scales, rows, cols)?));
                }
                values.push((stacked_name(l, w), vec![t.num_experts, rows, cols], all));
            }
        }
        Net::from_values(&cfg, values, device)
    }

    /// The bytes of every K3 tensor the export writes (spine rounded to its dtype, experts
    /// quantised to MXFP4), by name.
    pub fn k3_tensors(&self) -> Result<HashMap<String, Vec<u8>>> {
        let mut out = HashMap::new();
        let named: HashMap<String, Tensor> = self.named_values()?.into_iter().collect();
        for s in spine_specs(&self.cfg) {
            let t = named
                .get(&s.name)
                .ok_or_else(|| Error::Msg(format!("the trainer has no `{}`", s.name)))?;
            let v: Vec<f32> = t.flatten_all()?.to_vec1()?;
            let bytes: Vec<u8> = match s.dtype {
                Dtype::BF16 => v
                    .iter()
                    .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                    .collect(),
                _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            };
            out.insert(s.name, bytes);
        }
        let t = self.cfg.text();
        let shapes = self.cfg.expert_matrix_shapes();
        for l in self.cfg.moe_layers() {
            for (m, &(rows, cols)) in shapes.iter().enumerate() {
                let w = ["w1", "w2", "w3"][m];
                let all: Vec<f32> = self.p(&stacked_name(l, w))?.flatten_all()?.to_vec1()?;
                for e in 0..t.num_experts {
                    let one = &all[e * rows * cols..(e + 1) * rows * cols];
                    let (packed, scales) = quantize(one, rows, cols);
                    let base = format!("{PREFIX}model.layers.{l}.block_sparse_moe.experts.{e}.{w}");
                    out.insert(format!("{base}.weight_packed"), packed);
                    out.insert(format!("{base}.weight_scale"), scales);
                }
            }
        }
        Ok(out)
    }
}
