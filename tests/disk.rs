//! End-to-end: the guest reads a generated disk through virtio-blk in ring 3
//! and its checksum equals the host's; a read-only disk refuses a write; the
//! device's I/O thread runs on the housekeeping cores.

mod common;

use common::*;
use stagevm_report::Report;
use stagevm_testkit::checksum::fnv1a;

/// A deterministic disk image of `bytes` bytes: the default image's
/// xorshift64 stream (`stagevm_mkdisk::generate`).
fn make_disk(name: &str, bytes: usize) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("stagevm-{name}-{}.img", std::process::id()));
    std::fs::write(&path, stagevm_mkdisk::generate(bytes)).unwrap();
    path
}

fn boot_with_disk(disk: &str, cmdline: &str) -> (Run, Report) {
    boot_with_report(&["--disk", disk, "--cmdline", cmdline])
}

#[test]
fn guest_reads_the_disk_and_its_checksum_matches() {
    let path = make_disk("read", 6 << 20);
    let expected = fnv1a(&std::fs::read(&path).unwrap());
    let (run, json) = boot_with_disk(&format!("path={}", path.display()), "iters=1000 requests=0");
    let _ = std::fs::remove_file(&path);
    assert_read_whole(&run, &json, 6 << 20, expected);
}

/// `direct=on` (`O_DIRECT`, through the aligned bounce buffer) reads the
/// same bytes and writes; `id=` names the device in the report.
#[test]
fn a_direct_disk_with_an_id_reads_and_writes() {
    let path = make_disk("direct", 3 << 20);
    let before = std::fs::read(&path).unwrap();
    let expected = fnv1a(&before);
    let (run, json) = boot_with_disk(
        &format!("path={},direct=on,id=data-0", path.display()),
        "iters=1000 requests=0 diskwrite=1 diskchunk=4096",
    );
    let line = format!(
        "testguest: disk {} sectors ({} bytes), fnv1a {expected:#018x}",
        (3 << 20) / 512,
        3 << 20
    );
    assert!(run.stdout.contains(&line), "{line} in {}", run.stdout);
    // The whole disk, then sector 0 again before writing it back.
    assert_eq!(json.disks[0].bytes_read, (3 << 20) + 512);
    assert_eq!((json.disks[0].errors, json.disks[0].dropped), (0, 0));
    assert!(
        run.stdout.contains("testguest: disk write accepted"),
        "{}",
        run.stdout
    );
    assert_eq!(json.disks[0].name, "data-0");
    assert_eq!(json.disks[0].bytes_written, 512);
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let _ = std::fs::remove_file(&path);
    // A bad id and a repeated one are named.
    expect_vmm_error(
        &[
            "--kernel",
            guest_image().to_str().unwrap(),
            "--disk",
            "path=/dev/null,id=a/b",
        ],
        &["disk id", "a/b"],
    );
}

/// The guest read the whole disk of `bytes` bytes, its checksum is
/// `expected`, and the device counted the size and the bytes, without
/// errors or drops.
fn assert_read_whole(run: &Run, json: &Report, bytes: u64, expected: u64) {
    let sectors = bytes / 512;
    let line = format!("testguest: disk {sectors} sectors ({bytes} bytes), fnv1a {expected:#018x}");
    assert!(
        run.stdout.contains(&line),
        "expected '{line}' in {}",
        run.stdout
    );
    let disk = &json.disks[0];
    assert_eq!(disk.sectors, sectors);
    assert_eq!(disk.bytes_read, bytes);
    assert_eq!(disk.errors, 0);
    assert_eq!(disk.dropped, 0);
}

#[test]
fn read_only_disk_rejects_a_write_and_writable_accepts_it() {
    let path = make_disk("ro", 1 << 20);
    let before = std::fs::read(&path).unwrap();
    let (run, json) = boot_with_disk(
        &format!("path={},readonly=on", path.display()),
        "iters=1000 requests=0 diskwrite=1",
    );
    assert!(run.stdout.contains("read-only true"), "{}", run.stdout);
    assert!(
        run.stdout
            .contains("testguest: disk write refused: IoError"),
        "{}",
        run.stdout
    );
    assert_eq!(json.disks[0].errors, 1);
    assert_eq!(json.disks[0].bytes_written, 0);
    assert_eq!(std::fs::read(&path).unwrap(), before);

    let (run, json) = boot_with_disk(
        &format!("path={}", path.display()),
        "iters=1000 requests=0 diskwrite=1",
    );
    assert!(
        run.stdout.contains("testguest: disk write accepted"),
        "{}",
        run.stdout
    );
    assert_eq!(json.disks[0].bytes_written, 512);
    // Sector 0 was written back unchanged.
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn io_thread_runs_on_housekeeping_cores() {
    let path = make_disk("affinity", 1 << 20);
    let guest = guest_image();
    let _lock = vm_lock();
    let config = std::env::temp_dir().join(format!("stagevm-disk-{}.toml", std::process::id()));
    std::fs::write(&config, "[host]\ncores = \"1\"\nhousekeeping = \"0\"\n").unwrap();
    let disk = format!("path={}", path.display());
    let child = spawn(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--cpus",
        "boot=2",
        "--stages",
        config.to_str().unwrap(),
        "--disk",
        &disk,
        "--cmdline",
        "iters=100000000000",
    ]);
    // The thread pins itself as it starts: wait for it to settle.
    let threads = watch_threads(child, |t| {
        t.get("io-blk0").is_some_and(|m| m.iter().all(|c| c == "0"))
    });
    let seen = threads.get("io-blk0").map(|masks| masks.join(" "));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&config);
    assert_eq!(
        seen.as_deref(),
        Some("0"),
        "io-blk0 must be on the housekeeping core"
    );
}

#[test]
fn missing_disk_file_is_named() {
    let guest = guest_image();
    let run = run(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--disk",
        "path=/nonexistent/disk.img",
    ]);
    run.assert_no_panic();
    assert_eq!(run.code(), 1, "{run:#?}");
    assert!(
        run.stderr.contains(
            "--disk path=/nonexistent/disk.img: its directory /nonexistent does not exist"
        ),
        "{}",
        run.stderr
    );
}

/// The staged threads' per-thread checksum, written again from the guest's
/// stage code (`images/testguest/src/staged/workload/pipeline.rs`, with `work=0`): parse =
/// FNV-1a over the request's bytes, folded into word 0; plan = insertion sort,
/// returning words 3 ^ 5; execute = a 512-word table updated at
/// `(w >> 7 ^ i) % 512` with `rotl(t + w, 11)`; checksum =
/// `rotl(sum, 3) ^ a ^ 3b ^ c` over the thread's requests.
fn thread_checksum(disk: &[u8], id: u64, requests: u64) -> u64 {
    let span = (disk.len().min(16 << 20) / 64 * 64) as u64;
    let mut table = [0u64; 512];
    let mut sum = 0u64;
    for r in 0..requests {
        let at = ((id * requests + r) * 64 % span) as usize;
        let mut req: Vec<u64> = disk[at..at + 64]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let bytes: Vec<u8> = req.iter().flat_map(|w| w.to_le_bytes()).collect();
        let a = fnv1a(&bytes);
        req[0] ^= a;
        req.sort_unstable();
        let b = req[3] ^ req[5];
        let mut c = 0u64;
        for (i, w) in req.iter().enumerate() {
            let j = ((*w >> 7) as usize ^ i) % 512;
            table[j] = table[j].wrapping_add(*w).rotate_left(11);
            c ^= table[j];
        }
        sum = sum.rotate_left(3) ^ a ^ b.wrapping_mul(3) ^ c;
    }
    sum
}

#[test]
fn threads_process_the_request_stream_read_from_the_disk() {
    let path = make_disk("requests", 2 << 20);
    let disk = std::fs::read(&path).unwrap();
    let (run, _) = boot_with_disk(
        &format!("path={},readonly=on", path.display()),
        "iters=1000 threads=2 requests=300",
    );
    let _ = std::fs::remove_file(&path);
    let mut seen = 0;
    for line in run.stdout.lines().filter(|l| l.starts_with("thread ")) {
        let n = numbers(line);
        let (id, requests) = (n[0], n[2]);
        let sum = u64::from_str_radix(line.rsplit("0x").next().unwrap(), 16).unwrap();
        assert_eq!(sum, thread_checksum(&disk, id, requests), "{line}");
        seen += 1;
    }
    assert_eq!(seen, 2, "{}", run.stdout);
}

/// A writable image is locked while a VMM has it open: a second VMM is
/// refused with a message naming the path (issue 14 D17); a read-only disk
/// takes a shared lock, which a writer's exclusive lock also excludes.
#[test]
fn a_writable_disk_is_locked_against_a_second_vmm() {
    use std::os::fd::AsRawFd;
    let path = make_disk("locked", 1 << 20);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // SAFETY: flock(2) on our own descriptor, standing in for another VMM.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(locked, 0);
    let guest = guest_image();
    for disk in [
        format!("path={}", path.display()),
        format!("path={},readonly=on", path.display()),
    ] {
        expect_vmm_error(
            &["--kernel", guest.to_str().unwrap(), "--disk", &disk],
            &[path.to_str().unwrap(), "locked by another process"],
        );
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
}

/// Detaches a loop device when dropped.
struct LoopDevice(String);

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

/// A block device is served with its real size (`BLKGETSIZE64`), read-only
/// as asked, and the guest reads the same bytes as from the file behind it.
/// Needs `losetup` and permission to attach a loop device; says "skipped"
/// otherwise.
#[test]
fn a_block_device_is_served_with_its_real_size() {
    let path = make_disk("loop", 2 << 20);
    let expected = fnv1a(&std::fs::read(&path).unwrap());
    let attached = std::process::Command::new("losetup")
        .args(["--find", "--show", "--read-only", path.to_str().unwrap()])
        .output();
    let dev = match attached {
        Ok(out) if out.status.success() => {
            LoopDevice(String::from_utf8_lossy(&out.stdout).trim().to_string())
        }
        Ok(out) => {
            let _ = std::fs::remove_file(&path);
            eprintln!(
                "skipped: losetup cannot attach a loop device here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return;
        }
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            eprintln!("skipped: no losetup ({e})");
            return;
        }
    };
    let (run, json) = boot_with_disk(
        &format!("path={},readonly=on", dev.0),
        "iters=1000 requests=0",
    );
    drop(dev);
    let _ = std::fs::remove_file(&path);
    assert_read_whole(&run, &json, 2 << 20, expected);
    assert!(json.disks[0].readonly);
}

/// A directory, a FIFO and a missing file are refused before boot, each
/// named with the reason.
#[test]
fn paths_that_are_not_disks_are_refused_before_boot() {
    let guest = guest_image();
    let fifo = std::env::temp_dir().join(format!("stagevm-fifo-disk-{}", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let dir = std::env::temp_dir();
    let missing = format!("/nonexistent-stagevm-{}/d.img", std::process::id());
    for (disk, why) in [
        (dir.display().to_string(), "is a directory".to_string()),
        (fifo.display().to_string(), "is a FIFO".to_string()),
        (
            missing.clone(),
            format!(
                "its directory /nonexistent-stagevm-{} does not exist",
                std::process::id()
            ),
        ),
    ] {
        let arg = format!("path={disk},readonly=on");
        expect_vmm_error(
            &["--kernel", guest.to_str().unwrap(), "--disk", &arg],
            &[&format!("--disk path={disk}"), &why],
        );
    }
    let _ = std::fs::remove_file(&fifo);
}
