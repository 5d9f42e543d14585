//! The family registry: every checkpoint is opened by the family its config.json's
//! `model_type` names; a value no family runs (or none at all) is an error that names it and
//! the families that exist, from the library and from the command line, before any weight is
//! read.

mod common;

use deltafin::models::{family, FAMILIES};
use deltafin::Error;

/// A copy of K3-nano's files with config.json's root `model_type` set to `t` (removed: None).
fn nano_as(t: Option<&str>) -> tempfile::TempDir {
    let src = common::nano();
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
        }
    }
    let p = d.path().join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    match t {
        Some(t) => v["model_type"] = t.into(),
        None => {
            v.as_object_mut().unwrap().remove("model_type");
        }
    }
    std::fs::write(&p, v.to_string()).unwrap();
    d
}

#[test]
fn each_registered_family_claims_its_model_types_alone() {
    let mut seen = std::collections::HashSet::new();
    for f in FAMILIES {
        assert!(
            !f.model_types().is_empty(),
            "{} accepts no model_type",
            f.name()
        );
        for t in f.model_types() {
            assert!(seen.insert(*t), "model_type {t} claimed twice");
        }
    }
    assert_eq!(family(&common::nano()).unwrap().name(), "Kimi K3");
}

#[test]
fn an_unknown_model_type_is_refused_naming_it_and_the_known_ones() {
    let d = nano_as(Some("qwen2_vl"));
    let e = family(d.path())
        .err()
        .expect("an unknown model_type must not open");
    assert!(matches!(e, Error::UnknownFamily { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("\"qwen2_vl\""), "{msg}");
    for f in FAMILIES {
        for t in f.model_types() {
            assert!(msg.contains(t), "{msg} does not name {t}");
        }
    }
    // The engine refuses it the same way, before reading weights.
    let e = deltafin::Engine::open(d.path(), &Default::default())
        .err()
        .expect("the engine must refuse it");
    assert!(matches!(e, Error::UnknownFamily { .. }), "{e:?}");
    // And the command line says it, naming the file.
    let out = common::deltafin_cmd(&[
        "run",
        "--model-root",
        d.path().to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("qwen2_vl") && err.contains("config.json"),
        "{err}"
    );
}

#[test]
fn a_config_without_model_type_is_refused() {
    let d = nano_as(None);
    let e = family(d.path()).err().expect("no model_type must not open");
    assert!(e.to_string().contains("model_type missing"), "{e}");
}
