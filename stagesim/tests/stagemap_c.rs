//! The stage-map files stagesim writes, read by the Linux agent's C parser
//! (`guest-agent/linux/libstage/stagemap_file.c`, through `stagectl
//! --map-file`): the same canonical text back, and the same verdict (line
//! and reason) on malformed files.

use std::path::{Path, PathBuf};
use std::process::Command;

use stagesim::stagemap::{MapStage, StageMapFile};

/// Builds stagectl out of tree; `None` (and the test says "skipped") when
/// `make` or a C compiler is missing.
fn stagectl() -> Option<PathBuf> {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("stagemap-stagectl");
    let linux = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-agent/linux");
    let r = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(&linux)
        .arg(format!("BUILD={}", out.display()))
        .arg("stagectl")
        .output();
    match r {
        Ok(r) if r.status.success() => Some(out.join("stagectl/stagectl")),
        Ok(r) => panic!(
            "make stagectl failed:\n{}{}",
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        ),
        Err(e) => {
            eprintln!("skipped: cannot run make ({e}); install build-essential");
            None
        }
    }
}

/// Runs `stagectl --map-file` on `text`: (exit success, stdout, stderr).
fn c_parse(bin: &Path, dir: &Path, name: &str, text: &str) -> (bool, String, String) {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    let r = Command::new(bin)
        .arg("--map-file")
        .arg(&p)
        .output()
        .unwrap();
    (
        r.status.success(),
        String::from_utf8(r.stdout).unwrap(),
        String::from_utf8(r.stderr).unwrap(),
    )
}

#[test]
fn the_c_parser_reads_what_stagesim_writes_and_refuses_what_it_refuses() {
    let Some(bin) = stagectl() else { return };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("stagemap-files");
    std::fs::create_dir_all(&dir).unwrap();
    let map = StageMapFile {
        binary: Some("/usr/sbin/mariadbd".into()),
        stages: vec![
            MapStage {
                name: "s0".into(),
                symbols: vec!["_Z16dispatch_command19enum_server_commandP3THDPcjb".into()],
            },
            MapStage {
                name: "s1".into(),
                symbols: vec!["_ZN4JOIN8optimizeEv".into(), "_ZN4JOIN4execEv".into()],
            },
        ],
        request: Some((1, vec!["_Z10do_commandP3THDb".into()])),
    };
    let text = map.to_text(&["written by the test".into(), "# a comment with #".into()]);
    let (ok, out, err) = c_parse(&bin, &dir, "good.map", &text);
    assert!(ok, "{err}");
    assert_eq!(out, map.to_text(&[]));
    assert_eq!(StageMapFile::parse(&out).unwrap(), map);

    for (i, bad) in [
        "",
        "stage a b\n",
        "stagemap 1\n",
        "stagemap 1\nstage a x\nstage b x\n",
        "stagemap 1\nstage a x\nstage a y\n",
        "stagemap 1\nrequest a x\n",
        "stagemap 1\nstage a x\nrequest a y\nrequest a z\n",
        "stagemap 1\nstage a\n",
        "stagemap 1\nstage a/b x\n",
        "stagemap 1\nbinary\n",
        "stagemap 1\nbinary a\nbinary b\n",
        "stagemap 2\nstage a x\n",
        "stagemap 1\nstage abcdefghijklmnopqrstuvwxyz012345 x\n",
    ]
    .iter()
    .enumerate()
    {
        let e = StageMapFile::parse(bad).expect_err(bad);
        let (ok, _, err) = c_parse(&bin, &dir, &format!("bad{i}.map"), bad);
        assert!(!ok, "C accepted {bad:?}");
        assert!(
            err.trim_end().ends_with(&format!(": {e}")),
            "{bad:?}: C says {err:?}, Rust {e}"
        );
    }
}
