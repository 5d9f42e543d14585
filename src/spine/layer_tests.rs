use super::*;
use crate::checkpoint::DtypeExt;

/// 20,000 mutated spine files (random bytes in the header, edited JSON values: 1-D int8
/// entries, empty shapes, huge dimensions, lengths and offsets): reading them and asking for
/// every tensor never panics and never allocates past the file.
#[test]
fn mutated_headers_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("layer-000.bin");
    let q: Vec<u8> = (0..12u8).collect();
    let sc: Vec<u8> = (0..3u16)
        .flat_map(|_| half::f16::from_f32(0.5).to_le_bytes())
        .collect();
    let bf: Vec<u8> = (0..8u16)
        .flat_map(|i| half::bf16::from_f32(i as f32).to_le_bytes())
        .collect();
    let tensors = vec![
        ("m".to_string(), Dtype::I8, vec![3, 4], q),
        ("m.row_scale".to_string(), Dtype::F16, vec![3], sc),
        ("n".to_string(), Dtype::BF16, vec![8], bf),
    ];
    write_file(&p, &tensors, "fp").unwrap();
    let good = std::fs::read(&p).unwrap();
    let hlen = u64::from_le_bytes(good[8..16].try_into().unwrap()) as usize;
    let json = String::from_utf8(good[16..16 + hlen].to_vec()).unwrap();
    let swaps = [
        ("[3,4]", "[12]"),
        ("[3,4]", "[]"),
        ("[3,4]", "[18446744073709551615,2]"),
        ("[8]", "[0]"),
        ("\"BF16\"", "\"I8\""),
        ("\"len\":12", "\"len\":1200000000000"),
        ("\"offset\":", "\"offset\":9"),
    ];
    let pool = BufPool::new(1);
    let mut rng = crate::checkpoint::rng::Rng::new(11);
    for i in 0..20_000 {
        let mut b = good.clone();
        if i % 2 == 0 {
            let (from, to) = swaps[rng.below(swaps.len() as u64) as usize];
            let j = json.replacen(from, to, 1);
            let mut h = (j.len() as u64).to_le_bytes().to_vec();
            h.extend_from_slice(j.as_bytes());
            b.splice(8..16 + hlen, h);
        } else {
            for _ in 0..1 + rng.below(4) {
                let at = rng.below((16 + hlen) as u64) as usize;
                b[at] = rng.next_u64() as u8;
            }
        }
        std::fs::write(&p, &b).unwrap();
        // What is accepted is consistent: every tensor's length is its dtype times its shape.
        if let Ok(es) = parse_header(&b, b.len(), &p) {
            for e in es {
                let size = e.dtype.bytes() as usize;
                let numel: usize = e.shape.iter().product();
                assert_eq!(e.len, numel * size, "{e:?}");
            }
        }
        if let Ok(ld) = read_file(&p, &pool) {
            assert!(ld.bytes() <= b.len());
            let _ = ld.matrix("m", 3, 4).map(|m| m.rows);
            let _ = ld.values("m", &[3, 4]);
            let _ = ld.values("n", &[8]);
            let _ = ld.verify();
        }
    }
}

#[test]
fn file_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("layer-000.bin");
    let w: Vec<u8> = (0..6u16)
        .flat_map(|i| half::bf16::from_f32(i as f32).to_le_bytes())
        .collect();
    let tensors = vec![
        ("a.weight".to_string(), Dtype::BF16, vec![2, 3], w),
        (
            "b".to_string(),
            Dtype::F32,
            vec![1],
            2.5f32.to_le_bytes().to_vec(),
        ),
    ];
    write_file(&p, &tensors, "fp-a").unwrap();
    assert!(is_complete(&p));
    // The file records the checkpoint it came from; another checkpoint's is not current.
    assert!(is_current(&p, "fp-a"));
    assert!(!is_current(&p, "fp-b"));
    assert_eq!(file_source(&p), Some(Some("fp-a".to_string())));
    let pool = BufPool::new(2);
    let ld = read_file(&p, &pool).unwrap();
    assert_eq!(ld.source(), Some("fp-a"));
    ld.verify().unwrap();
    assert_eq!(ld.values("b", &[1]).unwrap(), vec![2.5]);
    let m = ld.matrix("a.weight", 2, 3).unwrap();
    assert_eq!(m.get(1, 2), 5.0);
    assert!(ld.matrix("a.weight", 3, 2).is_err());
    // A truncated file is detected.
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
    assert!(!is_complete(&p));
    assert!(!is_current(&p, "fp-a"));
    assert!(read_file(&p, &pool).is_err());
}
