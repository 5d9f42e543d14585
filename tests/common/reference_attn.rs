//! The reference's attention, one token at a time: KDA (the delta-rule recurrence with its short
//! convolutions) and MLA (latent cache, NoPE), from k3-spec.md §3.4-3.5.

use super::*;

impl Reference {
    pub(super) fn kda(&mut self, l: usize, x: &[f64]) -> Vec<f64> {
        let t = self.cfg.text().clone();
        let la = &t.linear_attn_config;
        let (hk, d, cw) = (la.num_heads, la.head_dim, la.short_conv_kernel_size);
        let p = hk * d;
        let qp = matvec(self.g(l, "self_attn.q_proj.weight"), p, x);
        let kp = matvec(self.g(l, "self_attn.k_proj.weight"), p, x);
        let vp = matvec(self.g(l, "self_attn.v_proj.weight"), p, x);
        let fa = matvec(self.g(l, "self_attn.f_a_proj.weight"), d, x);
        let graw = matvec(self.g(l, "self_attn.f_b_proj.weight"), p, &fa);
        let braw = matvec(self.g(l, "self_attn.b_proj.weight"), hk, x);
        let gout = matvec(self.g(l, "self_attn.g_proj.weight"), p, x);
        let convw: Vec<Vec<f64>> = ["q", "k", "v"]
            .iter()
            .map(|n| self.g(l, &format!("self_attn.{n}_conv1d.weight")).to_vec())
            .collect();
        let a_log = self.g(l, "self_attn.A_log").to_vec();
        let dt_bias = self.g(l, "self_attn.dt_bias").to_vec();
        let o_norm = self.g(l, "self_attn.o_norm.weight").to_vec();
        let o_proj = self.g(l, "self_attn.o_proj.weight").to_vec();
        let LayerState::Kda { hist, s } = &mut self.state[l] else {
            panic!()
        };
        let mut ys = Vec::new();
        for (which, xp) in [qp, kp, vp].into_iter().enumerate() {
            let hw = &mut hist[which];
            let mut src: Vec<Vec<f64>> = hw.clone();
            src.push(xp);
            let y: Vec<f64> = (0..p)
                .map(|c| {
                    let a: f64 = (0..cw).map(|j| convw[which][c * cw + j] * src[j][c]).sum();
                    a * sigmoid(a)
                })
                .collect();
            *hw = src[1..].to_vec();
            ys.push(y);
        }
        let mut out = vec![0.0; p];
        for h in 0..hk {
            let seg = |v: &Vec<f64>| v[h * d..(h + 1) * d].to_vec();
            let (mut q, mut k, v) = (seg(&ys[0]), seg(&ys[1]), seg(&ys[2]));
            // fla's in-kernel norm: the 1e-6 inside the root (spec §3.4).
            let nq = (q.iter().map(|a| a * a).sum::<f64>() + 1e-6).sqrt();
            let nk = (k.iter().map(|a| a * a).sum::<f64>() + 1e-6).sqrt();
            q.iter_mut().for_each(|a| *a = *a / nq / (d as f64).sqrt());
            k.iter_mut().for_each(|a| *a /= nk);
            let beta = sigmoid(braw[h]);
            let sh = &mut s[h * d * d..(h + 1) * d * d];
            for kk in 0..d {
                // A_log is per head (spec §3.4): head h's one value for all its channels.
                let g = la.gate_lower_bound
                    * sigmoid(a_log[h].exp() * (graw[h * d + kk] + dt_bias[h * d + kk]));
                for vv in 0..d {
                    sh[kk * d + vv] *= g.exp();
                }
            }
            let pred: Vec<f64> = (0..d)
                .map(|vv| (0..d).map(|kk| k[kk] * sh[kk * d + vv]).sum())
                .collect();
            for kk in 0..d {
                for vv in 0..d {
                    sh[kk * d + vv] += beta * k[kk] * (v[vv] - pred[vv]);
                }
            }
            let o: Vec<f64> = (0..d)
                .map(|vv| (0..d).map(|kk| q[kk] * sh[kk * d + vv]).sum())
                .collect();
            let on = rmsnorm(&o, &o_norm, t.rms_norm_eps);
            for vv in 0..d {
                out[h * d + vv] = on[vv] * sigmoid(gout[h * d + vv]);
            }
        }
        matvec(&o_proj, t.hidden_size, &out)
    }

    pub(super) fn mla(&mut self, l: usize, x: &[f64]) -> Vec<f64> {
        let t = self.cfg.text().clone();
        let (nh, nope, rope, vd, kl) = (
            t.num_attention_heads,
            t.qk_nope_head_dim,
            t.qk_rope_head_dim,
            t.v_head_dim,
            t.kv_lora_rank,
        );
        let qa = matvec(self.g(l, "self_attn.q_a_proj.weight"), t.q_lora_rank, x);
        let q = matvec(
            self.g(l, "self_attn.q_b_proj.weight"),
            nh * (nope + rope),
            &rmsnorm(
                &qa,
                self.g(l, "self_attn.q_a_layernorm.weight"),
                1e-6, // MLA's latent norms keep KimiRMSNorm's default eps (spec §3.5)
            ),
        );
        let ckv = matvec(
            self.g(l, "self_attn.kv_a_proj_with_mqa.weight"),
            kl + rope,
            x,
        );
        let cn = rmsnorm(
            &ckv[..kl],
            self.g(l, "self_attn.kv_a_layernorm.weight"),
            1e-6,
        );
        let kv = matvec(
            self.g(l, "self_attn.kv_b_proj.weight"),
            nh * (nope + vd),
            &cn,
        );
        let gate = matvec(self.g(l, "self_attn.g_proj.weight"), nh * vd, x);
        let o_proj = self.g(l, "self_attn.o_proj.weight").to_vec();
        let LayerState::Mla { k: kc, v: vc } = &mut self.state[l] else {
            panic!()
        };
        let mut kt = Vec::new();
        let mut vt = Vec::new();
        for h in 0..nh {
            kt.extend_from_slice(&kv[h * (nope + vd)..h * (nope + vd) + nope]);
            kt.extend_from_slice(&ckv[kl..]);
            vt.extend_from_slice(&kv[h * (nope + vd) + nope..(h + 1) * (nope + vd)]);
        }
        kc.push(kt);
        vc.push(vt);
        let dq = nope + rope;
        let mut o = vec![0.0; nh * vd];
        for h in 0..nh {
            let qh = &q[h * dq..(h + 1) * dq];
            let sc: Vec<f64> = kc
                .iter()
                .map(|k| (0..dq).map(|i| qh[i] * k[h * dq + i]).sum::<f64>() / (dq as f64).sqrt())
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for (pos, ei) in e.iter().enumerate() {
                for j in 0..vd {
                    o[h * vd + j] += ei / z * vc[pos][h * vd + j];
                }
            }
        }
        for (oi, gi) in o.iter_mut().zip(&gate) {
            *oi *= sigmoid(*gi);
        }
        matvec(&o_proj, t.hidden_size, &o)
    }
}
