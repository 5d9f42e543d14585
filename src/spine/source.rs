//! `Spine`: hands the model each layer's dense tensors, from the spine store (one sequential
//! read per layer, BF16 or row-int8) or from the checkpoint shards. Layers that fit the RAM
//! budget are pinned; the others stream through a small set of reusable aligned buffers (the CPU
//! "template layers"), read ahead by a background thread while the previous layer computes, or,
//! on a tight memory plan, read (or mapped from the store) when the model asks for each.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use candle::{Device, Tensor};

use super::ahead::Readahead;
use super::backing::{choose_pinned, pack_from_shards, small_from_file, Backing, Inner};
use super::convert::{global_names, is_small, layer_names, SpineFormat};
use super::layer::{parse_header, read_file, Entry, LayerData};
use super::report::SpineReport;
use super::to_f32;
use crate::checkpoint::DtypeExt;
use crate::checkpoint::Inventory;
use crate::fsio::BufPool;
use crate::{Error, Result};

pub use super::options::{SpineChoice, SpineOptions};
pub use pass::Pass;

#[path = "pass.rs"]
mod pass;

/// A layer's data for one pass: pinned (shared) or streamed (owned for this use).
pub enum LayerRef {
    /// Resident for the whole run.
    Pinned(Arc<LayerData>),
    /// Read for this pass; its buffer returns to the pool when dropped.
    Streamed(LayerData),
}

impl std::ops::Deref for LayerRef {
    type Target = LayerData;
    fn deref(&self) -> &LayerData {
        match self {
            LayerRef::Pinned(a) => a,
            LayerRef::Streamed(d) => d,
        }
    }
}

/// Loads the pinned layers (`pin[l]`), with their device copies where a device side is given.
fn load_pinned(
    inner: &Inner,
    pin: &[bool],
    gpu: Option<&dyn super::DeviceSide>,
) -> Result<Vec<Option<Arc<LayerData>>>> {
    let mut pinned = Vec::with_capacity(pin.len());
    for (l, p) in pin.iter().enumerate() {
        pinned.push(if *p {
            let mut d = inner.load_pinned(l)?;
            d.kernel = inner.kernel;
            if let Some(g) = gpu {
                g.pin(&mut d)?;
            }
            Some(Arc::new(d))
        } else {
            None
        });
    }
    Ok(pinned)
}

/// The spine store's embedding: `embed.bin` mapped, and its one tensor's entry.
fn embed_file(dir: &Path) -> Result<(memmap2::Mmap, Entry)> {
    let ep = dir.join("embed.bin");
    let f = std::fs::File::open(&ep).map_err(|e| Error::io(&ep, e))?;
    let len = f.metadata().map_err(|e| Error::io(&ep, e))?.len() as usize;
    let mut head = vec![0u8; 4096.min(len)];
    f.read_exact_at(&mut head, 0)
        .map_err(|e| Error::io(&ep, e))?;
    let e = parse_header(&head, len, &ep)?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Msg(format!("{}: no embedding tensor", ep.display())))?;
    Ok((crate::fsio::map_random(&f, &ep)?, e))
}

/// The checkpoint's embedding: its shard mapped, and where the tensor lies in it.
fn embed_shard(inv: &Inventory) -> Result<(memmap2::Mmap, Entry)> {
    let name = inv.name(&inv.names.embedding);
    let t = inv.get(&name).ok_or_else(|| Error::Tensor {
        name: name.clone(),
        msg: "missing".into(),
    })?;
    let sp = inv.shard_path(t.shard);
    let f = std::fs::File::open(&sp).map_err(|e| Error::io(&sp, e))?;
    let map = crate::fsio::map_random(&f, &sp)?;
    let e = Entry {
        name,
        dtype: t.dtype,
        shape: t.shape.clone(),
        offset: t.start as usize,
        len: t.len() as usize,
        checksum: 0,
    };
    Ok((map, e))
}

/// Refuses an embedding that is not a non-empty `[vocab, hidden]` matrix inside its file.
fn check_embedding(e: &Entry, file_len: usize) -> Result<()> {
    let row_bytes = e.shape.get(1).copied().unwrap_or(0) * e.dtype.bytes() as usize;
    if e.shape.len() != 2
        || e.shape.contains(&0)
        || e.len != e.shape[0] * row_bytes
        || e.offset + e.len > file_len
    {
        return Err(Error::Tensor {
            name: e.name.clone(),
            msg: format!("the embedding must be [vocab, hidden], found {:?}", e.shape),
        });
    }
    Ok(())
}

/// The spine of a model.
pub struct Spine {
    inner: Arc<Inner>,
    /// Template layers and pinned copies on the compute device (Metal), if any.
    gpu: Option<Arc<dyn super::DeviceSide>>,
    device: Device,
    pinned: Vec<Option<Arc<LayerData>>>,
    layer_bytes: Vec<u64>,
    global: LayerData,
    /// The embedding: its file mapped read-only (`embed.bin` or the shard), and where it lies.
    embed: (memmap2::Mmap, Entry),
    in_flight: usize,
    stream_cap: usize,
    /// Bytes of streamed layers handed out so far (what the spine read from storage).
    streamed_read: std::sync::atomic::AtomicU64,
}

impl Spine {
    /// Opens the spine of the model in `root` (whose shards `inv` describes).
    pub fn open(
        root: &Path,
        inv: Arc<Inventory>,
        num_layers: usize,
        device: &Device,
        opts: &SpineOptions,
    ) -> Result<Spine> {
        let (backing, format) = Self::backing(root, &inv, num_layers, opts.choice)?;
        let layer_bytes = Self::layer_sizes(&backing, &inv, num_layers);
        if opts.mapped && matches!(backing, Backing::Shards(_)) {
            return Err(Error::Msg(format!(
                "{}: streaming layers larger than the memory budget maps them from the spine store; write it first (`deltafin convert-spine --model-root {}`)",
                root.display(),
                root.display()
            )));
        }
        let inner = Arc::new(Inner {
            backing,
            inv: inv.clone(),
            format,
            pool: BufPool::new(opts.in_flight.max(1)),
            direct: opts.direct.into(),
            kernel: opts.dense,
            mapped: opts.mapped,
            ahead: opts.mapped.then(Readahead::start).flatten(),
        });
        let gpu = opts.device_side.clone();
        // A pinned layer on the GPU also has a device copy (the host one serves the host-side
        // ops), so on unified memory it costs twice its size.
        let budget = opts.resident_bytes.unwrap_or(u64::MAX) / if gpu.is_some() { 2 } else { 1 };
        let pin = match &opts.pin {
            Some(p) if p.len() == num_layers => p.clone(),
            Some(p) => {
                return Err(Error::Msg(format!(
                    "pin list has {} layers, the model {num_layers}",
                    p.len()
                )))
            }
            None => choose_pinned(&layer_bytes, budget),
        };
        // Every streamed buffer is sized for the largest streamed layer (a template layer), so
        // the pool holds at most `in_flight` of them whatever the layer order.
        let stream_cap = (0..num_layers)
            .filter(|&l| !pin[l])
            .map(|l| layer_bytes[l] as usize)
            .max()
            .unwrap_or(0);
        let pinned = load_pinned(&inner, &pin, gpu.as_deref())?;
        let (mut global, embed) = match &inner.backing {
            Backing::Files(d) => (
                read_file(&d.join("global.bin"), &BufPool::new(1))?,
                embed_file(d)?,
            ),
            Backing::Shards(s) => {
                let g = pack_from_shards(
                    s,
                    &global_names(&inv),
                    &inv.prefix,
                    |_| true,
                    &BufPool::new(0),
                    0,
                    false,
                )?;
                (g, embed_shard(&inv)?)
            }
        };
        check_embedding(&embed.1, embed.0.len())?;
        global.kernel = opts.dense;
        if let Some(g) = &gpu {
            g.pin(&mut global)?;
        }
        Ok(Spine {
            inner,
            gpu,
            device: device.clone(),
            pinned,
            layer_bytes,
            global,
            embed,
            // A mapped layer is read as it is used: map it when the model asks for it.
            in_flight: if opts.mapped {
                1
            } else {
                opts.in_flight.max(1)
            },
            stream_cap,
            streamed_read: Default::default(),
        })
    }

    /// The device small tensors are placed on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The host arithmetic of the layers' matrices.
    pub fn kernel(&self) -> crate::kernels::dense::DenseKernel {
        self.inner.kernel
    }

    /// The format in use.
    pub fn format(&self) -> SpineFormat {
        self.inner.format
    }

    /// The store files of the streamed layers (empty when the spine comes from the shards).
    pub fn streamed_files(&self) -> Vec<std::path::PathBuf> {
        if !self.from_store() {
            return Vec::new();
        }
        (0..self.pinned.len())
            .filter(|&l| self.pinned[l].is_none())
            .map(|l| self.inner.layer_path(l))
            .collect()
    }

    /// Reads streamed layers (store files, or the shards' tensors) with parallel `O_DIRECT`
    /// requests from now on (or not); mapped layers (`SpineOptions::mapped`) stay mapped.
    pub fn set_direct(&self, on: bool) {
        self.inner
            .direct
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether streamed layers are read with `O_DIRECT` (never when they are mapped).
    pub fn direct(&self) -> bool {
        self.inner.direct.load(std::sync::atomic::Ordering::Relaxed) && !self.inner.mapped
    }

    /// Bytes of mapped layers queued to be read ahead (0 unless layers are mapped:
    /// `SpineOptions::mapped`).
    pub fn read_ahead_bytes(&self) -> u64 {
        self.inner.ahead.as_ref().map_or(0, |ra| ra.queued())
    }

    /// Whether the spine comes from a converted store (rather than the shards).
    pub fn from_store(&self) -> bool {
        matches!(self.inner.backing, Backing::Files(_))
    }

    /// The small tensors of layer `l` (norms, conv weights, gates' parameters), read once.
    pub fn small(&self, l: usize) -> Result<LayerData> {
        match &self.inner.backing {
            Backing::Files(_) => small_from_file(&self.inner.layer_path(l)),
            Backing::Shards(s) => pack_from_shards(
                s,
                &layer_names(&self.inner.inv, l),
                &self.inner.inv.layer_name(l, ""),
                is_small,
                &BufPool::new(0),
                0,
                false,
            ),
        }
    }

    /// Layer `l`'s layout (names, shapes, dtypes, offsets) as every pass hands the layer over:
    /// what the model binds its matrices to at load.
    pub fn layout(&self, l: usize) -> Result<Vec<Entry>> {
        match &self.inner.backing {
            Backing::Files(_) => super::slot::read_layout(&self.inner.layer_path(l)),
            Backing::Shards(s) => {
                let strip = self.inner.inv.layer_name(l, "");
                let pieces =
                    super::gather::pieces(s, &layer_names(&self.inner.inv, l), &strip, |_| true)?;
                Ok(super::gather::layout(&pieces).0)
            }
        }
    }

    /// The tail tensors (final norm, output AttnRes, lm_head), resident.
    pub fn global(&self) -> &LayerData {
        &self.global
    }

    /// Embedding rows `ids` as f32 `[ids.len(), H]`, copied from the mapped file (the page
    /// cache holds the rows a run touches and shares them with other processes on the root).
    /// Mapping won over a positioned read per row in `bench spine` cold and warm (README).
    pub fn embed_rows(&self, ids: &[u32]) -> Result<Tensor> {
        let (map, e) = &self.embed;
        let (rows, cols) = (e.shape[0], e.shape.get(1).copied().unwrap_or(0));
        let dtype = e.dtype;
        let rb = cols * dtype.bytes() as usize;
        // Ask for every row first, so the reads of a cold prompt go out together (`bench spine`:
        // 2,048 cold K3 rows in 58 ms against 204 ms by one read per row, and no slower warm).
        for &id in ids.iter().filter(|&&id| (id as usize) < rows) {
            let _ = map.advise_range(memmap2::Advice::WillNeed, e.offset + id as usize * rb, rb);
        }
        let mut out = Vec::with_capacity(ids.len() * cols);
        for &id in ids {
            if id as usize >= rows {
                return Err(Error::Msg(format!(
                    "token id {id} is outside the embedding (0..{rows})"
                )));
            }
            // In bounds: `open` checked that the whole tensor lies inside the mapping.
            let at = e.offset + id as usize * rb;
            out.extend(to_f32(&map[at..at + rb], dtype, &e.name)?);
        }
        Ok(Tensor::from_vec(out, (ids.len(), cols), &self.device)?)
    }

    /// Bytes of streamed layers read so far (each streamed layer counts once per pass).
    pub fn bytes_read(&self) -> u64 {
        self.streamed_read
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn count_streamed(&self, l: usize) {
        let b = self.layer_bytes.get(l).copied().unwrap_or(0);
        self.streamed_read
            .fetch_add(b, std::sync::atomic::Ordering::Relaxed);
    }

    /// Layers pinned / streamed, and bytes read per token.
    pub fn report(&self) -> SpineReport {
        let pinned = self.pinned.iter().filter(|p| p.is_some()).count();
        let streamed_bytes = self
            .pinned
            .iter()
            .zip(&self.layer_bytes)
            .filter(|(p, _)| p.is_none())
            .map(|(_, b)| *b)
            .sum();
        SpineReport {
            format: self.inner.format,
            from_store: self.from_store(),
            layers_pinned: pinned,
            layers_streamed: self.pinned.len() - pinned,
            resident_bytes: self.layer_bytes.iter().sum::<u64>() - streamed_bytes,
            bytes_read_per_token: streamed_bytes,
            direct: self.direct(),
            mapped: self.inner.mapped && streamed_bytes > 0,
            streamed_files: self.streamed_files(),
        }
    }

    /// Layer `l` alone, outside a pass (pinned: shared; streamed: read now into its own buffer).
    pub fn load_layer(&self, l: usize) -> Result<LayerRef> {
        if let Some(Some(p)) = self.pinned.get(l) {
            return Ok(LayerRef::Pinned(p.clone()));
        }
        self.streamed(l, self.inner.load(l, &BufPool::new(0), 0))
    }

    /// A streamed layer's data as read, with the spine's kernel, counted and on the device.
    fn streamed(&self, l: usize, data: Result<LayerData>) -> Result<LayerRef> {
        let mut d = data?;
        d.kernel = self.inner.kernel;
        self.count_streamed(l);
        if let Some(g) = &self.gpu {
            g.upload(&mut d)?;
        }
        Ok(LayerRef::Streamed(d))
    }
}
