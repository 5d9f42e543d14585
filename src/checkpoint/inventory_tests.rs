//! Shard naming and ordering: `parse_shard_name`, `order_shards` (1-based and gpt-oss's
//! zero-based sets).

use super::*;

#[test]
fn shard_names() {
    assert_eq!(
        parse_shard_name("model-00001-of-000096.safetensors"),
        Some((1, 96))
    );
    assert_eq!(parse_shard_name("model-1-of-2.safetensors"), Some((1, 2)));
    assert_eq!(parse_shard_name("model-a-of-2.safetensors"), None);
    assert_eq!(parse_shard_name("model-00001-of-000096.bin"), None);
    let d = Path::new("/x");
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(order_shards(
        &names(&[
            "model-00002-of-00002.safetensors",
            "model-00001-of-00002.safetensors"
        ]),
        d
    )
    .is_ok());
    assert!(order_shards(
        &names(&[
            "model-00002-of-00003.safetensors",
            "model-00001-of-00003.safetensors"
        ]),
        d
    )
    .is_err());
    assert!(order_shards(
        &names(&[
            "model-00001-of-00002.safetensors",
            "model-00001-of-00003.safetensors"
        ]),
        d
    )
    .is_err());
    assert!(order_shards(&[], d).is_err());
    // gpt-oss's zero-based names: all of 0..=N, in order; a gap is still an error.
    let zero = names(&[
        "model-00002-of-00002.safetensors",
        "model-00000-of-00002.safetensors",
        "model-00001-of-00002.safetensors",
    ]);
    assert_eq!(
        order_shards(&zero, d).unwrap(),
        [zero[1].clone(), zero[2].clone(), zero[0].clone()]
    );
    assert!(order_shards(&zero[..2], d).is_err());
    assert!(order_shards(&[zero[1].clone(), zero[2].clone()], d).is_err());
}
