//! Reads that bypass the page cache with several aligned requests in flight: the streamed spine
//! layers on a machine whose page cache cannot hold them (a buffered read there only evicts what
//! the next token needs, and one synchronous stream leaves the drive's queue mostly empty).
//! Linux `O_DIRECT`; elsewhere (and where a filesystem refuses `O_DIRECT`) the caller's buffered
//! read is used instead. Whole files (`read_all`, the spine store) or any list of aligned pieces
//! (`read_requests`, a layer gathered from the shards). Knows nothing of models.

use std::fs::File;
use std::path::Path;

#[cfg(target_os = "linux")]
use crate::Error;
use crate::Result;

/// Bytes per request: this machine's virtual disk read 1.47 GB/s with 4 × 1 MiB in flight,
/// 0.93 GB/s with 4 × 16 MiB and 0.95 GB/s with 16 × 1 MiB (`bench forward --floor` bound).
pub const REQUEST: usize = 1 << 20;
/// Requests in flight.
pub const READERS: usize = 4;
/// What `O_DIRECT` needs of offsets, lengths and buffer addresses.
pub const IO_ALIGN: usize = 4096;

/// `path` opened for direct reads; `None` where this platform or filesystem does not do them.
pub fn open(path: &Path) -> Result<Option<File>> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
            Err(e) => Err(Error::io(path, e)),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        Ok(None)
    }
}

/// One aligned piece to read: `want` bytes (fewer only where the file ends) from offset `off`
/// into `dst` (aligned address and length, `IO_ALIGN`).
pub struct Request<'a> {
    /// The file opened by `open`.
    pub direct: &'a File,
    /// The same file opened plainly: a piece the filesystem refuses is read through it.
    pub buffered: &'a File,
    /// For errors.
    pub path: &'a Path,
    /// Offset in the file.
    pub off: u64,
    /// Bytes that must arrive.
    pub want: usize,
    /// Destination.
    pub dst: &'a mut [u8],
}

/// Reads every request on `READERS` threads, request i on reader i % READERS (in file order, so
/// all readers advance together).
pub fn read_requests(reqs: Vec<Request<'_>>) -> Result<()> {
    let mut per: Vec<Vec<Request>> = (0..READERS).map(|_| Vec::new()).collect();
    for (i, r) in reqs.into_iter().enumerate() {
        per[i % READERS].push(r);
    }
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = per
            .into_iter()
            .filter(|mine| !mine.is_empty())
            .map(|mine| s.spawn(move || mine.into_iter().try_for_each(read_one)))
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| crate::Error::Msg("a direct reader panicked".into()))??;
        }
        Ok(())
    })
}

/// Reads every request in order on this thread (a caller that already runs several readers).
pub fn read_serial(reqs: Vec<Request<'_>>) -> Result<()> {
    reqs.into_iter().try_for_each(read_one)
}

fn read_one(r: Request<'_>) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::FileExt;
        let mut done = 0;
        while done < r.want {
            match r.direct.read_at(&mut r.dst[done..], r.off + done as u64) {
                Ok(0) => {
                    return Err(Error::Msg(format!(
                        "{}: ends at {} of the {} bytes wanted from {}",
                        r.path.display(),
                        r.off + done as u64,
                        r.want,
                        r.off
                    )))
                }
                Ok(n) => done += n,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    return r
                        .buffered
                        .read_exact_at(&mut r.dst[done..r.want], r.off + done as u64)
                        .map_err(|e| Error::io(r.path, e));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(r.path, e)),
            }
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        use std::os::unix::fs::FileExt;
        r.buffered
            .read_exact_at(&mut r.dst[..r.want], r.off)
            .map_err(|e| crate::Error::io(r.path, e))
    }
}

/// Reads the first `len` bytes of the file at `path` (`buffered`: it, opened plainly) into the
/// pooled `buf` with `REQUEST`-sized direct reads on this thread; the buffer's window is widened
/// to the aligned length for the reads and set back to `len`. `Ok(false)`: nothing was read (no
/// direct reads here, or the buffer cannot hold the aligned length).
pub fn read_head_serial(
    path: &Path,
    buffered: &File,
    len: usize,
    buf: &mut crate::fsio::PooledBuf,
) -> Result<bool> {
    let padded = len.div_ceil(IO_ALIGN) * IO_ALIGN;
    if !buf.set_window(0, padded) {
        return Ok(false);
    }
    let direct = match open(path) {
        Ok(Some(d)) if (buf.as_ptr() as usize).is_multiple_of(IO_ALIGN) => d,
        other => {
            buf.set_window(0, len);
            return match other {
                // Removed since the caller opened it (by another process sharing the cache):
                // the caller's handle still reads the bytes.
                Err(crate::Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    Ok(false)
                }
                other => other.map(|_| false),
            };
        }
    };
    let reqs = buf
        .chunks_mut(REQUEST)
        .enumerate()
        .map(|(i, dst)| Request {
            direct: &direct,
            buffered,
            path,
            off: (i * REQUEST) as u64,
            want: dst.len().min(len - i * REQUEST),
            dst,
        })
        .collect();
    let read = read_serial(reqs);
    buf.set_window(0, len);
    read.map(|()| true)
}

/// Reads all `len` bytes of `path` into `buf` (page-aligned, at least `len` rounded up to
/// `IO_ALIGN` long) in `REQUEST`-sized direct reads. `Ok(false)`: this platform or filesystem
/// does not do direct reads (nothing was read; read it some other way).
pub fn read_all(path: &Path, len: usize, buf: &mut [u8]) -> Result<bool> {
    let padded = len.div_ceil(IO_ALIGN) * IO_ALIGN;
    if buf.len() < padded || !(buf.as_ptr() as usize).is_multiple_of(IO_ALIGN) {
        return Ok(false);
    }
    let Some(direct) = open(path)? else {
        return Ok(false);
    };
    let buffered = File::open(path).map_err(|e| crate::Error::io(path, e))?;
    let reqs = buf[..padded]
        .chunks_mut(REQUEST)
        .enumerate()
        .map(|(i, dst)| Request {
            direct: &direct,
            buffered: &buffered,
            path,
            off: (i * REQUEST) as u64,
            want: dst.len().min(len - i * REQUEST),
            dst,
        })
        .collect();
    read_requests(reqs)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_byte_of_odd_sized_files() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 1, 4095, 4096, REQUEST + 7, 5 * REQUEST + 4097] {
            let p = dir.path().join(format!("f{len}"));
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            std::fs::write(&p, &data).unwrap();
            let mut buf = crate::fsio::AlignedBuf::new(len.div_ceil(IO_ALIGN) * IO_ALIGN).unwrap();
            if read_all(&p, len, &mut buf).unwrap() {
                assert_eq!(&buf[..len], &data[..], "len {len}");
            }
        }
    }
}
