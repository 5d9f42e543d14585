//! Whole-file reads that bypass the page cache with several aligned requests in flight: the
//! streamed spine layers on a machine whose page cache cannot hold them (a buffered read there
//! only evicts what the next token needs, and one synchronous stream leaves the drive's queue
//! mostly empty). Linux `O_DIRECT`; elsewhere (and where a filesystem refuses `O_DIRECT`) the
//! caller's buffered read is used instead. Knows nothing of models.

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

/// Reads all `len` bytes of `path` into `buf` (page-aligned, at least `len` rounded up to
/// `IO_ALIGN` long) with `READERS` threads issuing `REQUEST`-sized `O_DIRECT` reads in file
/// order. `Ok(false)`: this platform or filesystem does not do direct reads (nothing was read;
/// read it some other way).
pub fn read_all(path: &Path, len: usize, buf: &mut [u8]) -> Result<bool> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let padded = len.div_ceil(IO_ALIGN) * IO_ALIGN;
        if buf.len() < padded || !(buf.as_ptr() as usize).is_multiple_of(IO_ALIGN) {
            return Ok(false);
        }
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(false),
            Err(e) => return Err(Error::io(path, e)),
        };
        let chunks: Vec<(usize, &mut [u8])> = buf[..padded]
            .chunks_mut(REQUEST)
            .enumerate()
            .map(|(i, c)| (i * REQUEST, c))
            .collect();
        let mut per: Vec<Vec<(usize, &mut [u8])>> = (0..READERS).map(|_| Vec::new()).collect();
        for (i, c) in chunks.into_iter().enumerate() {
            per[i % READERS].push(c); // request i on reader i % READERS: all advance together
        }
        let refused = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| -> Result<()> {
            let hs: Vec<_> = per
                .into_iter()
                .map(|mine| {
                    let (f, refused) = (&f, &refused);
                    s.spawn(move || -> Result<()> {
                        for (off, c) in mine {
                            let mut done = 0;
                            while done < c.len() && off + done < len {
                                match f.read_at(&mut c[done..], (off + done) as u64) {
                                    Ok(0) => {
                                        return Err(Error::Msg(format!(
                                            "{}: ends at {} of {len} bytes",
                                            path.display(),
                                            off + done
                                        )))
                                    }
                                    Ok(n) => done += n,
                                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                                        refused.store(true, std::sync::atomic::Ordering::Relaxed);
                                        return Ok(());
                                    }
                                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                                    Err(e) => return Err(Error::io(path, e)),
                                }
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in hs {
                h.join()
                    .map_err(|_| Error::Msg(format!("{}: a reader panicked", path.display())))??;
            }
            Ok(())
        })?;
        Ok(!refused.into_inner())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (path, len, buf);
        Ok(false)
    }
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
