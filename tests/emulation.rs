//! End-to-end: Linux-style kernel-mode boots (PVH and bzImage) of tiny guests
//! assembled here with binutils (`as`, `ld`, `objcopy`), and what stagevm does
//! when the guest executes an instruction KVM cannot emulate in kernel mode.
//!
//! Each guest prints its boot-protocol data (the command line it finds
//! through `hvm_start_info` or `boot_params`, and the CPUID leaf 1 it sees)
//! on the serial port (the bzImage guest then also runs `fwait` and an
//! `int3` with a `#BP` handler, which stagevm completes for `kvm_pvm`), then
//! executes `popcnt` in ring 0 (which this
//! project's software KVM, `kvm_pvm`, cannot emulate: `docs/design.md`)
//! followed by `ud2` (with no IDT a triple fault, for a KVM that runs
//! `popcnt`). Either way stagevm must exit with status 2 within seconds and
//! report the vCPU, RIP and the instruction bytes at RIP.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use hypercall_abi::platform::EXIT_GUEST_FAILURE;

/// Serial output helpers shared by both guests (`puts`: NUL-terminated string
/// at `si`; `puthex`: `%ebp` as 8 hex digits, counting in `cx`), for
/// registers of the guest's width.
fn serial_helpers(si: &str, cx: &str) -> String {
    format!(
        r#"
puts:
    mov $0x3f8, %dx
1:  movb ({si}), %al
    test %al, %al
    jz 2f
    out %al, %dx
    inc {si}
    jmp 1b
2:  ret
puthex:
    mov $8, {cx}
    mov $0x3f8, %dx
3:  rol $4, %ebp
    mov %ebp, %eax
    and $0xf, %eax
    cmp $10, %eax
    jb 4f
    add $0x27, %eax              /* 'a' - '0' - 10 */
4:  add $0x30, %eax              /* '0' */
    out %al, %dx
    dec {cx}
    jnz 3b
    ret
"#
    )
}

/// The PVH guest: 32-bit protected mode, paging off, `EBX` = start_info.
const PVH_GUEST: &str = r#"
    .section .note.Xen, "a", @note
    .balign 4
    .long 4, 4, 18          /* namesz, descsz, XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .long pvh_entry

    .text
    .code32
    .globl _start
_start:
pvh_entry:
    mov $0x80000, %esp
    mov %ebx, %edi
    lea banner, %esi
    call puts
    cmpl $0x336ec578, (%edi)     /* hvm_start_info.magic */
    jne bad
    mov 0x18(%edi), %esi         /* cmdline_paddr */
    call puts
    lea cpuid_msg, %esi
    call puts
    mov $1, %eax
    cpuid
    mov %edx, %ebp
    call puthex
    lea nl, %esi
    call puts
    popcnt %ebx, %eax
    ud2
bad:
    lea badmsg, %esi
    call puts
    ud2
SERIAL
banner: .asciz "emutest: pvh cmdline=["
cpuid_msg: .asciz "] cpuid1.edx="
badmsg: .asciz "bad start_info magic\n"
nl: .asciz "\n"
"#;

/// The bzImage payload: 64-bit code at load address + 0x200, `RSI` =
/// boot_params. Position-independent (RIP-relative) so it needs no linking.
const BZIMAGE_GUEST: &str = r#"
    .text
    .code64
    .org 0
    hlt                           /* 32-bit entry: not used */
    .org 0x200
entry64:
    mov %rsi, %rdi
    lea banner(%rip), %rsi
    call puts
    cmpl $0x53726448, 0x202(%rdi) /* boot_params.hdr.header = "HdrS" */
    jne bad
    movl 0x228(%rdi), %esi        /* hdr.cmd_line_ptr */
    call puts
    lea cpuid_msg(%rip), %rsi
    call puts
    mov $1, %eax
    cpuid
    mov %edx, %ebp
    call puthex
    lea nl(%rip), %rsi
    call puts
    /* fwait with no x87 exception pending: stagevm steps over it. */
    fwait
    /* IDT with a #BP gate (present, DPL0 interrupt gate, CS 0x10), then
       int3: stagevm injects #BP, the handler prints and returns. */
    lea idt(%rip), %rdi
    lea bp_handler(%rip), %rax
    mov %ax, 48(%rdi)
    movw $0x10, 50(%rdi)
    movw $0x8e00, 52(%rdi)
    shr $16, %rax
    mov %ax, 54(%rdi)
    shr $16, %rax
    mov %eax, 56(%rdi)
    sub $16, %rsp
    movw $(16 * 256 - 1), (%rsp)
    mov %rdi, 2(%rsp)
    lidt (%rsp)
    add $16, %rsp
    int3
    lea after_bp(%rip), %rsi
    call puts
    popcnt %rbx, %rax
    ud2
bp_handler:
    lea bp_msg(%rip), %rsi
    call puts
    iretq
bad:
    lea badmsg(%rip), %rsi
    call puts
    ud2
SERIAL
bp_msg: .asciz "emutest: #BP handled\n"
after_bp: .asciz "emutest: back from #BP\n"
    .balign 16
idt: .fill 256 * 16, 1, 0
banner: .asciz "emutest: bzimage cmdline=["
cpuid_msg: .asciz "] cpuid1.edx="
badmsg: .asciz "bad boot_params header\n"
nl: .asciz "\n"
"#;

/// A scratch directory for this test binary's guests.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stagevm-emulation-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs a binutils tool, panicking with its output (and a hint) on failure.
fn tool(name: &str, args: &[&str], dir: &Path) {
    let out = Command::new(name)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{name}` ({e}): install binutils (`just setup`)"));
    assert!(
        out.status.success(),
        "{name} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The PVH guest, built once per test binary: the tests run in parallel
/// and share the scratch directory, so building it per test raced (one
/// test read `pvh.elf` while another rewrote it: "no ELF magic").
fn pvh_guest() -> PathBuf {
    static GUEST: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    GUEST.get_or_init(build_pvh_guest).clone()
}

/// The bzImage guest, built once per test binary (see [`pvh_guest`]).
fn bzimage_guest() -> PathBuf {
    static GUEST: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    GUEST.get_or_init(build_bzimage_guest).clone()
}

/// Assembles and links the PVH guest: an ELF64 with a PVH note, loaded at
/// 1 MiB.
fn build_pvh_guest() -> PathBuf {
    let dir = scratch();
    let source = PVH_GUEST.replace("SERIAL", &serial_helpers("%esi", "%ecx"));
    std::fs::write(dir.join("pvh.S"), source).unwrap();
    std::fs::write(
        dir.join("pvh.ld"),
        "ENTRY(_start)\nSECTIONS {\n  . = 0x100000;\n  .text : { *(.text) }\n  .note.Xen : { *(.note.Xen) }\n}\n",
    )
    .unwrap();
    tool("as", &["--64", "-o", "pvh.o", "pvh.S"], &dir);
    tool(
        "ld",
        &[
            "-m",
            "elf_x86_64",
            "--build-id=none",
            "-T",
            "pvh.ld",
            "-o",
            "pvh.elf",
            "pvh.o",
        ],
        &dir,
    );
    dir.join("pvh.elf")
}

/// Builds a bzImage: one 512-byte setup sector after the boot sector with a
/// 2.15 setup header (LOADED_HIGH, XLF_KERNEL_64), then the payload.
fn build_bzimage_guest() -> PathBuf {
    let dir = scratch();
    let source = BZIMAGE_GUEST.replace("SERIAL", &serial_helpers("%rsi", "%rcx"));
    std::fs::write(dir.join("bz.S"), source).unwrap();
    tool("as", &["--64", "-o", "bz.o", "bz.S"], &dir);
    tool(
        "objcopy",
        &["-O", "binary", "-j", ".text", "bz.o", "bz.bin"],
        &dir,
    );
    let payload = std::fs::read(dir.join("bz.bin")).unwrap();
    let mut image = vec![0u8; 1024];
    let put = |image: &mut Vec<u8>, off: usize, bytes: &[u8]| {
        image[off..off + bytes.len()].copy_from_slice(bytes)
    };
    put(&mut image, 0x1f1, &[1]); // setup_sects
    put(&mut image, 0x1fe, &0xaa55u16.to_le_bytes()); // boot_flag
    put(&mut image, 0x202, b"HdrS");
    put(&mut image, 0x206, &0x020fu16.to_le_bytes()); // protocol 2.15
    put(&mut image, 0x211, &[1]); // loadflags: LOADED_HIGH
    put(&mut image, 0x214, &0x10_0000u32.to_le_bytes()); // code32_start
    put(&mut image, 0x22c, &0x7fff_ffffu32.to_le_bytes()); // initrd_addr_max
    put(&mut image, 0x230, &0x20_0000u32.to_le_bytes()); // kernel_alignment
    put(&mut image, 0x236, &1u16.to_le_bytes()); // xloadflags: XLF_KERNEL_64
    put(&mut image, 0x238, &2047u32.to_le_bytes()); // cmdline_size
    put(&mut image, 0x258, &0x10_0000u64.to_le_bytes()); // pref_address
    put(&mut image, 0x260, &0x10_0000u32.to_le_bytes()); // init_size
    image.extend_from_slice(&payload);
    let path = dir.join("bzImage");
    std::fs::write(&path, image).unwrap();
    path
}

/// Whether `/dev/kvm` is this project's software KVM, which emulates guest
/// kernel mode and cannot emulate `popcnt`.
fn kvm_pvm() -> bool {
    Path::new("/sys/module/kvm_pvm").exists()
}

/// Boots `kernel` and checks the failure report; returns the run.
fn boot_and_expect_failure(kernel: &Path, cmdline: &str, banner: &str) -> Run {
    let _lock = vm_lock();
    let child = spawn(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--cmdline",
        cmdline,
        "--memory",
        "size=64M",
        "--no-stage-device",
    ]);
    // Generous for a loaded 2-core machine; the guests run a few hundred
    // instructions.
    let run = wait(child, Duration::from_secs(30));
    run.assert_no_panic();
    assert_eq!(run.code(), i32::from(EXIT_GUEST_FAILURE), "{run:#?}");
    assert!(
        run.elapsed < Duration::from_secs(20),
        "took {:?}",
        run.elapsed
    );
    // The command line arrives, with the TSC rate stagevm appends for Linux
    // kernels (they cannot calibrate it when kernel mode is emulated).
    let expected = format!("{banner}{cmdline} tsc_early_khz=");
    assert!(
        run.stdout.contains(&expected) && run.stdout.contains("] cpuid1.edx="),
        "guest output should contain '{expected}…] cpuid1.edx=': {run:#?}"
    );
    // vCPU, RIP, CPL and the bytes at RIP (read through the guest's paging
    // mode) are all in the report.
    assert!(run.stderr.contains("vCPU 0: "), "{}", run.stderr);
    assert!(run.stderr.contains(" at RIP 0x10"), "{}", run.stderr);
    assert!(run.stderr.contains("(CPL 0"), "{}", run.stderr);
    if run.stderr.contains("emulation failure") {
        // popcnt: f3 [REX.W] 0f b8.
        assert!(
            run.stderr.contains("code: f3 0f b8") || run.stderr.contains("code: f3 48 0f b8"),
            "{}",
            run.stderr
        );
    } else {
        assert!(
            !kvm_pvm(),
            "kvm_pvm should fail to emulate popcnt: {}",
            run.stderr
        );
        // A KVM that runs popcnt reaches the ud2 (0f 0b) and triple-faults.
        assert!(
            run.stderr.contains("triple fault") && run.stderr.contains("code: 0f 0b"),
            "{}",
            run.stderr
        );
    }
    eprintln!("{}{}", run.stdout, run.stderr);
    run
}

#[test]
fn pvh_guest_emulation_failure_is_reported() {
    let run = boot_and_expect_failure(&pvh_guest(), "hello pvh", "emutest: pvh cmdline=[");
    assert!(
        run.stderr.contains("protected mode, paging off"),
        "{}",
        run.stderr
    );
}

#[test]
fn bzimage_guest_emulation_failure_is_reported() {
    let run = boot_and_expect_failure(
        &bzimage_guest(),
        "hello bzimage console=ttyS0",
        "emutest: bzimage cmdline=[",
    );
    assert!(run.stderr.contains("4-level paging"), "{}", run.stderr);
    // The fwait and the int3 before the popcnt were completed by stagevm
    // (or run by a KVM that can), and the guest's #BP handler ran.
    assert!(
        run.stdout
            .contains("emutest: #BP handled\nemutest: back from #BP\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn boot_mode_must_fit_the_image() {
    let guest = guest_image();
    let pvh = pvh_guest();
    let bz = bzimage_guest();
    // The ring-3 test unikernel has no PVH note.
    expect_vmm_error(
        &["--kernel", guest.to_str().unwrap(), "--boot-mode", "pvh"],
        &["--boot-mode pvh", "no PVH entry note"],
    );
    expect_vmm_error(
        &["--kernel", bz.to_str().unwrap(), "--boot-mode", "unikernel"],
        &["--boot-mode unikernel", "bzImage"],
    );
    expect_vmm_error(
        &["--kernel", pvh.to_str().unwrap(), "--boot-mode", "bzimage"],
        &["not a bzImage"],
    );
    expect_vmm_error(
        &["--kernel", guest.to_str().unwrap(), "--boot-mode", "efi"],
        &["'efi'"],
    );
    // An initramfs is for Linux kernels only, and must exist.
    expect_vmm_error(
        &[
            "--kernel",
            guest.to_str().unwrap(),
            "--initramfs",
            pvh.to_str().unwrap(),
        ],
        &["--initramfs", "ring-3 unikernel"],
    );
    expect_vmm_error(
        &[
            "--kernel",
            pvh.to_str().unwrap(),
            "--initramfs",
            "/nonexistent/initrd",
        ],
        &["--initramfs /nonexistent/initrd"],
    );
    // Too little RAM for a Linux kernel names the size.
    expect_vmm_error(
        &["--kernel", pvh.to_str().unwrap(), "--memory", "size=16M"],
        &["--memory size=16M", "Linux"],
    );
    // Linux reads at most 2047 bytes of command line.
    let long = "x".repeat(3000);
    expect_vmm_error(
        &["--kernel", pvh.to_str().unwrap(), "--cmdline", &long],
        &["3000 bytes", "2047"],
    );
}
