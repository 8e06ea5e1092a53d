//! The capture's stage-symbol resolution fails loudly (issue 16): a stage
//! map naming a symbol the binary lacks makes `bench/capture/resolve_stages.py`
//! exit non-zero with the symbol named and write no table; the same program
//! with the real names resolves. (The whole capture self-test, which also
//! runs Valgrind, is `bench/capture/selftest.sh`.)

use std::path::PathBuf;
use std::process::Command;

fn capture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/capture")
}

#[test]
fn a_missing_stage_symbol_is_an_error_that_names_it() {
    let dir = std::env::temp_dir().join(format!("stagesim-capture-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("staged");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-O1", "-rdynamic", "-o"])
        .arg(&bin)
        .arg(capture_dir().join("selftest/staged.c"))
        .status();
    let python = Command::new("python3").arg("--version").output();
    if !built.is_ok_and(|s| s.success()) || python.is_err() {
        assert!(
            std::env::var("CI").is_err(),
            "cc or python3 missing under CI"
        );
        eprintln!("skipped: needs a C compiler ({cc}) and python3");
        return;
    }
    let resolve = |map: &str| {
        let table = dir.join(format!("{map}.tbl"));
        let out = Command::new("python3")
            .arg(capture_dir().join("resolve_stages.py"))
            .arg(capture_dir().join("selftest").join(map))
            .arg(&bin)
            .arg("--table")
            .arg(&table)
            .arg("--json")
            .arg(dir.join(format!("{map}.json")))
            .output()
            .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
            table.exists(),
        )
    };
    let (status, err, table) = resolve("missing-stages.toml");
    assert!(!status.success(), "exit {status}: {err}");
    assert!(err.contains("stage_does_not_exist"), "{err}");
    assert!(err.contains("stage b"), "{err}");
    assert!(!table, "no table is written");
    let (status, err, table) = resolve("staged-stages.toml");
    assert!(status.success() && table, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
