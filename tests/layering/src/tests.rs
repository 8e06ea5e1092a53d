use super::*;

/// Writes `files` (path, text) under a new directory.
fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

const PACKAGE: &str = "[package]\nname = \"x\"\n";

#[test]
fn this_checkout_has_no_import_against_the_direction() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let found = check(&root).unwrap();
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn planted_violations_are_each_found_and_named() {
    let dir = tree(&[
        (
            "Cargo.toml",
            "[workspace]\nmembers = [\"vmm\", \"host-sched\", \"stage-device\", \"bench\"]\n",
        ),
        ("vmm/Cargo.toml", PACKAGE),
        // host-sched depending on the VMM: against the direction.
        (
            "host-sched/Cargo.toml",
            "[package]\nname = \"host-sched\"\n[dependencies]\nstagevm = { path = \"../vmm\" }\n",
        ),
        // stage-device's dev-dependency on the test kit: allowed; on
        // bench: not.
        (
            "stage-device/Cargo.toml",
            "[package]\nname = \"sd\"\n[dev-dependencies]\nkit = { path = \"../tests/kit\" }\nb = { path = \"../bench\" }\n",
        ),
        ("bench/Cargo.toml", PACKAGE),
        // A device reaching the builder, grouped; arch reaching devices.
        (
            "vmm/src/devices/virtio/x.rs",
            "// crate::vmm in a comment is not an import\nuse crate::{arch::x86_64, builder::build};\n",
        ),
        ("vmm/src/arch/x86_64/y.rs", "fn f() { crate::devices::Bus::new(); }\n"),
        // The builder may use anything below it.
        ("vmm/src/builder/mod.rs", "use crate::devices::Bus;\nuse crate::vmm::Vmm;\n"),
        // host-sched setting an affinity.
        (
            "host-sched/src/topology.rs",
            "fn pin() { nix::sched::sched_setaffinity(p, &s); }\n// setpriority in a comment\n",
        ),
    ]);
    let found: Vec<String> = check(dir.path())
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert_eq!(found.len(), 5, "{found:#?}");
    let has = |s: &str| found.iter().any(|f| f.contains(s));
    assert!(has(
        "host-sched/Cargo.toml: dependencies `stagevm` is in vmm/"
    ));
    assert!(has(
        "stage-device/Cargo.toml: dev-dependencies `b` is in bench/"
    ));
    assert!(has(
        "vmm/src/devices/virtio/x.rs: `crate::builder`: devices may not import builder"
    ));
    assert!(has(
        "vmm/src/arch/x86_64/y.rs: `crate::devices`: arch may not import devices"
    ));
    assert!(has("host-sched/src/topology.rs: `sched_setaffinity`"));
}

#[test]
fn grouped_and_nested_crate_paths_are_read() {
    let m = crate_modules("use crate::{a::b, c, d::{e, f}};\nlet x = crate::g::h();");
    assert_eq!(
        m.into_iter().collect::<Vec<_>>(),
        ["a", "c", "d", "g"].map(String::from)
    );
}
