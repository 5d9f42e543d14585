//! `docs/ARCHITECTURE.md` is the crate's map: every top-level module of the library and every
//! family folder under `src/models/` must appear in it (as `name/` or `name.rs`), so a module
//! added without a place on the map fails here.

use std::path::Path;

#[test]
fn every_module_and_family_is_on_the_map() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let map = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let mut names: Vec<String> = lib
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("pub mod ")
                .or_else(|| l.trim().strip_prefix("mod "))
        })
        .map(|m| m.trim_end_matches(';').to_string())
        .collect();
    assert!(names.len() > 20, "modules read from src/lib.rs: {names:?}");
    for entry in std::fs::read_dir(root.join("src/models")).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !map.contains(&format!("{n}/")) && !map.contains(&format!("{n}.rs")))
        .collect();
    assert!(
        missing.is_empty(),
        "not on docs/ARCHITECTURE.md's map: {missing:?}"
    );
}
