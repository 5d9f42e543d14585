//! `read_span_direct` against `read_span_into` on spans at awkward offsets of a real file.

use super::*;

#[test]
fn direct_span_reads_match_buffered_reads() {
    let dir = tempfile::tempdir().unwrap();
    let len = 3 * crate::fsio::direct::REQUEST + 12_345;
    let json =
        format!("{{\"w\":{{\"dtype\":\"U8\",\"shape\":[{len}],\"data_offsets\":[0,{len}]}}}}");
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(json.as_bytes());
    let data_at = file.len() as u64;
    file.extend((0..len).map(|i| (i * 13 + i / 4096) as u8));
    std::fs::write(dir.path().join("model.safetensors"), &file).unwrap();
    let inv = Arc::new(Inventory::from_dir(dir.path()).unwrap());
    let files = ShardFiles::new(inv);
    let pool = BufPool::new(4);
    let end = file.len() as u64;
    let can = crate::fsio::direct::open(&dir.path().join("model.safetensors"))
        .unwrap()
        .is_some();
    let spans = [
        (data_at, 1u64),                   // one byte, unaligned
        (4096, 4096),                      // exactly one aligned page
        (data_at + 5, 2 * (1 << 20) + 77), // several requests, unaligned both ends
        (end - 10_000, 10_000),            // ends at the end of the file
        (data_at, end - data_at),          // everything
    ];
    for (start, n) in spans {
        let span = ExpertSpan {
            shard: 0,
            parts: vec![(start, n)],
            part_shards: Vec::new(),
        };
        let mut want = vec![0u8; n as usize];
        read_span_into(&files, &span, &mut want, CacheAdvice::Off).unwrap();
        assert_eq!(&want[..], &file[start as usize..(start + n) as usize]);
        match read_span_direct(&files, &span, &pool).unwrap() {
            Some(got) => assert!(got[..] == want[..], "span at {start}, {n} bytes"),
            None => assert!(
                !can,
                "a contiguous span on a direct-capable file is read directly"
            ),
        }
    }
    // Parts with a gap are never read directly.
    let gap = ExpertSpan {
        shard: 0,
        parts: vec![(data_at, 10), (data_at + 20, 10)],
        part_shards: Vec::new(),
    };
    assert!(read_span_direct(&files, &gap, &pool).unwrap().is_none());
}

#[test]
fn disk_cache_pooled_reads_match_the_published_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut cache = DiskCache::new(dir.path(), CacheAdvice::Auto).unwrap();
    cache.verify = true;
    let pool = BufPool::new(2);
    let lens = [1usize, 4095, 4096, (1 << 20) + 7, 3 * (1 << 20) + 4097];
    for (e, &len) in lens.iter().enumerate() {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 29 + e + i / 4096) as u8).collect();
        cache.publish(0, e, &bytes).unwrap();
        let mut buf = pool.take_sized(len, span_cap(len)).unwrap();
        assert!(cache.read_into_pooled(0, e, &mut buf).unwrap(), "len {len}");
        assert_eq!(buf.len(), len);
        assert!(buf[..] == bytes[..], "len {len}");
    }
    // A corrupted file fails its checksum on the direct path too, and is removed.
    let p = cache.path(0, 3);
    let mut b = std::fs::read(&p).unwrap();
    b[5000] ^= 1;
    std::fs::write(&p, &b).unwrap();
    let mut buf = pool.take_sized(lens[3], span_cap(lens[3])).unwrap();
    assert!(!cache.read_into_pooled(0, 3, &mut buf).unwrap());
    assert!(!p.exists());
}
