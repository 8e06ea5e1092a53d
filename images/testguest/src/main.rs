//! stagevm's test unikernel.
//!
//! Every vCPU enters [`rust_main`] directly in ring 3 (the boot protocol of
//! `hypercall_abi::boot`): there is no guest kernel-mode code at all, so on
//! the project's machines, where CPL0 is emulated, everything here runs
//! natively. Each vCPU runs [`workload`] and prints its checksum on COM1, then
//! runs the staged workload of [`staged`] (guest threads whose requests pass
//! through three stages, reported through the stage channel, moving to the
//! vCPUs the host's stage map gives each stage); the last vCPU to finish
//! prints the guest's own stage counts, per-vCPU counts, migrations and
//! throughput, and asks the VMM to shut down with exit code 0.
//!
//! Command line (space-separated `key=value`):
//! * `iters=N` — per-vCPU checksum workload iterations (default 1000000),
//! * `threads=N` — guest threads per vCPU in the staged phase (default 2, ≤ 16),
//! * `requests=N` — requests per guest thread (default 100; 0 skips the phase),
//! * `work=N` — extra iterations of an integer mixing loop in every stage of
//!   every request, times the stage's weight (default 0; costs time only, the
//!   checksums do not depend on it),
//! * `weights=A,B,C` — per-stage weights of `work` for parse, plan, execute
//!   (default 1,1,1),
//! * `phase=1` — a phase change: once half of all requests (guest-wide) are
//!   done, every thread uses the reversed weights (C,B,A), e.g. with
//!   `weights=4,1,1` parse is 4× heavier than execute first and execute 4×
//!   heavier than parse later,
//! * `workload=footprint` — the staged threads run the headline benchmark's
//!   i-cache-bound workload (`stage_workload`) instead of parse → plan →
//!   execute, with `stages=N` stages (default 2, ≤ 4), `funcs=N` generated
//!   functions per stage (default 1024, sets the code footprint), `calls=N`
//!   function calls per stage and request (default 400) and `data=N` words
//!   of data working set per thread (default 0); the thread checksums are
//!   `stage_workload::thread_checksum`'s,
//! * `ring=N` — stage ring entries per vCPU (power of two, default 256),
//! * `counters=0` — register the stage channel without per-vCPU counters,
//!   as a v1.1 guest: every switch is a ring event (default 1: counters,
//!   ABI minor 2, the rings only carry a trace when the VMM asks),
//! * `latency=0` — with counters, register without request-latency
//!   histograms, as a minor-3 guest (default 1: the agent times one request
//!   in N, ABI minor 4),
//! * `arrival=RATE` — open-loop load: the requests (threads × requests ×
//!   vCPUs in all, as in the closed loop) arrive at RATE per second for the
//!   whole guest, into a queue of `queue=N` (default 1024, ≤ 4096) that idle
//!   threads take from; a full queue drops the request (counted), the
//!   generator never waits; gaps `arrival_dist=fixed|poisson` (default
//!   poisson). Threads wait off the run queues between requests (their
//!   vCPUs idle as in the closed loop). Prints `testguest: open loop: …`:
//!   the rate achieved, drops, and p50/p99/p99.9 latency from arrival of
//!   the steady 10–90 % of the requests. Works with every workload, policy
//!   and visit policy (not with `hopper=`); `phases=ON:OFF[:OFFSET[:LOW]]`
//!   (ms) lets requests arrive only in busy windows of ON ms every ON +
//!   OFF ms, the first from OFFSET (RATE is the rate within a window;
//!   two guests with offsets 0 and ON are busy in turn: `just bench-host`),
//!   and with LOW at LOW % of RATE in the other windows (`just bench-auto`),
//! * `timed_every=N` — with counters, time one stage visit in N (a TSC read
//!   at its start and end; default 0: the agent paces them to about one
//!   per 16 µs per vCPU; 1 times every visit),
//! * `idle_spin_us=N` — an idle vCPU that shares its host core polls its run
//!   queue this long before it parks with WAIT (default 50),
//! * `owned_idle_us=N` — the same for a vCPU the host says is alone on its
//!   core (ABI minor 1; default 10000; 0 parks at once),
//! * `spill_us=N` — work conservation across stages: a vCPU idle this long
//!   with no thread of its own stages waiting anywhere takes a thread of
//!   another stage for the rest of that thread's visit (a spill, counted;
//!   default 0 = never). Threads of its own stages waiting on other vCPUs
//!   are always taken (steals), spill or not,
//! * `switch_cost=N` — a synthetic i-cache refill: N mixing iterations
//!   whenever a vCPU runs a different stage than the one it ran last (a
//!   test fixture under which staging wins by construction; default 0),
//! * `abuse=1` — send bad REGISTERs and corrupt ring entries first (tests the
//!   VMM's validation),
//! * `virtio_mmio.device=4K@ADDR:IRQ` — added by the VMM for each `--disk`:
//!   vCPU 0 reads the first disk whole and prints its FNV-1a checksum; the
//!   staged threads then take their requests from the disk's first 16 MiB
//!   (see `staged::set_request_source`),
//! * `netecho=1` — vCPU 0 echoes raw Ethernet frames on the first network
//!   card among the `virtio_mmio.device=` words (device id 1; the disk is
//!   the first with id 2) until a `STOP` frame; `netsink=1` counts frames
//!   until a `STOP` frame and `netsource=SIZE:COUNT` sends COUNT frames of
//!   SIZE bytes once a `GO!` frame came (`net-bench`; all in `net`),
//! * `highmem=1` — vCPU 0 writes a pattern into the first and the last
//!   page of the RAM above 4 GiB (`BootInfo::high_mem_start`, identity
//!   mapped like the rest), reads it back and prints
//!   `testguest: high memory [START, END) pages FIRST LAST ok`,
//! * `console=1` — vCPU 0 answers lines typed on the serial console until
//!   `quit` (`console`; `--serial pty` or `socket=`); `console_after=MS`
//!   first leaves it unread for MS ms (a guest that ignores its console),
//! * `diskchunk=N` — bytes per disk read request (default 65536, 512…1 MiB),
//! * `diskwrite=1` — then tries to write sector 0 back (a read-only disk
//!   refuses),
//! * `bench=1` — vCPU 0 measures `stage_enter`, a plain loop and a doorbell
//!   exit (see `staged::bench`),
//! * `hopper=N` — the staged phase becomes the thread-migration
//!   micro-benchmark (seed 000's `hopper`, `staged::hopper`; `N` = 2 or 3
//!   stages `hop0`…, 0 = off, not with `workload=footprint`): the threads
//!   switch stage round-robin with no work, `hops=N` switches in all
//!   (default 100000, the first 1000 dropped), each a migration to the vCPU
//!   serving the next stage, then as many local yields; prints
//!   `testguest: hopper …` lines (count, mean, p50, p99, max in ns and a
//!   200 ns histogram per pass). `requests=` is ignored, and `threads=`
//!   defaults to one thread in the whole guest (given, it is per vCPU),
//! * `hop_work=N` — hopper's threads run N mixing iterations after every
//!   switch (default 0), and `hop_pass=migrate|local|both` — which passes
//!   run (default both): with many threads per vCPU, `migration-bench`'s
//!   saturated mode compares the busy vCPU time of a `migrate` run with a
//!   `local` one (the `testguest: busy …` line),
//! * `hold=1` — once every vCPU finished, park them all (WAIT, 1 s at a
//!   time) instead of shutting down, after `testguest: holding until the
//!   VMM ends the VM`: the counters then stay still for the operator API
//!   (`tests/api.rs`) until it shuts the VM down,
//! * `hostile=NAME[,NAME…][,forever]` — attack the VMM instead of running the
//!   staged workload (`hostile`, `hostile::virtio`; tested by
//!   `tests/hostile.rs`): after the banner vCPU 0 runs the named attacks in
//!   this order, prints `hostile: NAME start` and a `hostile: NAME …`
//!   result line for each, then `hostile: done`, and shuts down with
//!   `exit=`; with `forever` it repeats them until the VMM is killed.
//!   Attacks:
//!   - `register_flood` — 100,000 REGISTERs of bad PFNs (75,000 `BadRange`:
//!     below 1 MiB, past RAM, near the top of the PFN space; 25,000
//!     `BadMagic`: a zeroed page), then 100,000 of the registered area
//!     (`AlreadyRegistered`);
//!   - `wake_flood` — 100,000 WAKEs, 50,000 of valid vCPUs and 50,000 of
//!     vCPUs out of range (`BadVcpu`);
//!   - `ring_wrap` — vCPU 0's ring head jumps to `u64::MAX − 8`, plausible
//!     entries run up to `u64::MAX` and across the wrap, then the head moves
//!     behind the tail: 3 bad indices and 24 valid events per round;
//!   - `prefill` — every ring filled completely with valid events and all
//!     heads published at once (use `ring=65536` and many vCPUs); vCPU 1
//!     times WAKE round trips before and during the drain and prints
//!     `hostile: prefill wake latency …` (ns);
//!   - `forged_tsc` — valid events whose TSC goes backwards, jumps to
//!     `u64::MAX`, falls to 0 and stays equal (1022 on vCPU 0's ring, 500 on
//!     vCPU 1's);
//!   - `virtio_bad` — (needs `--disk`) queue sizes 3 and 512, misaligned
//!     descriptor/driver/device addresses, a bad available index, a bad
//!     head, QueueNotify floods (100,000 on a ready queue, 1,000 on a
//!     stopped one), unoffered features; good reads in between must work;
//!   - `virtio_chains` — (needs `--disk`) looping chains, a chain whose
//!     next index is out of range, headers, data and status outside RAM,
//!     overflowing and huge lengths, an indirect descriptor, and a
//!     descriptor table outside RAM;
//!   - `counters` — impossible values in the counter blocks of vCPUs 0 and
//!     1 (counts going backwards, idle time and counts far beyond a policy
//!     period, state codes out of range, timed states in the far future),
//!     a kind every 10 ms for 400 ms (`hostile::counters`);
//!   - `reregister` — UNREGISTER + REGISTER of a 16-stage area in a loop for
//!     4 s;
//!   - `net_chains` — (needs `--net`) bad transmit chains on the network
//!     card: loops, a next index out of range, buffers outside RAM, a
//!     device-writable buffer, an indirect descriptor, a chain shorter than
//!     the header and a 4000-byte frame, then a good 60-byte frame;
//!   - `netspin` — (needs `--net`) the receive queue holds no buffer while
//!     frames come, and QueueNotify is written on it every ~50 µs for 10 s;
//!     then one buffer is posted, which must get a frame;
//! * `exit=N` — exit code to shut down with after the work (default 0),
//! * `fault=1` — execute `hlt` in ring 3 after the banner: a #GP with no IDT,
//!   i.e. a triple fault, to test the VMM's failure path.
#![no_std]
#![no_main]

use core::arch::{asm, global_asm};
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use hypercall_abi::boot::BootInfo;
use hypercall_abi::platform::{
    SERIAL_LSR, SERIAL_LSR_THR_EMPTY, SERIAL_PORT_BASE, SERIAL_THR, SHUTDOWN_PORT, VCPU_STOP_PORT,
};

global_asm!(
    r#"
    .section .text.entry, "ax"
    .global _start
_start:
    and rsp, -16
    call {main}
    ud2
"#,
    main = sym rust_main,
);

fn outb(port: u16, value: u8) {
    // SAFETY: port I/O has no memory effects; IOPL 3 allows it in ring 3.
    unsafe { asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack)) };
}

fn outl(port: u16, value: u32) {
    // SAFETY: as for `outb`.
    unsafe { asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack)) };
}

fn inl(port: u16) -> u32 {
    let value: u32;
    // SAFETY: as for `outb`.
    unsafe { asm!("in eax, dx", out("eax") value, in("dx") port, options(nomem, nostack)) };
    value
}

fn inb(port: u16) -> u8 {
    let value: u8;
    // SAFETY: as for `outb`.
    unsafe { asm!("in al, dx", out("al") value, in("dx") port, options(nomem, nostack)) };
    value
}

/// Current privilege level, from the low bits of CS.
fn cpl() -> u16 {
    let cs: u16;
    // SAFETY: reading CS has no side effects.
    unsafe { asm!("mov {0:x}, cs", out(reg) cs, options(nomem, nostack)) };
    cs & 3
}

/// Ends the VM with `code` (the VMM returns it as its exit status).
fn shutdown(code: u32) -> ! {
    outl(SHUTDOWN_PORT, code);
    loop {
        core::hint::spin_loop();
    }
}

/// Stops this vCPU for good.
fn stop_vcpu() -> ! {
    outb(VCPU_STOP_PORT, 0);
    loop {
        core::hint::spin_loop();
    }
}

/// A polled 16550 writer; the lock keeps lines of different vCPUs apart.
struct Console;

static CONSOLE_LOCK: AtomicBool = AtomicBool::new(false);

impl Write for Console {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for b in s.bytes() {
            while inb(SERIAL_PORT_BASE + SERIAL_LSR) & SERIAL_LSR_THR_EMPTY == 0 {
                core::hint::spin_loop();
            }
            outb(SERIAL_PORT_BASE + SERIAL_THR, b);
        }
        Ok(())
    }
}

fn print_line(args: core::fmt::Arguments) {
    while CONSOLE_LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        core::hint::spin_loop();
    }
    let _ = Console.write_fmt(args);
    let _ = Console.write_str("\n");
    CONSOLE_LOCK.store(false, Ordering::Release);
}

macro_rules! println {
    ($($arg:tt)*) => { print_line(format_args!($($arg)*)) };
}

/// `highmem=1` (module docs): the first and last 4 KiB page of the RAM
/// above 4 GiB, written and read back through the identity mapping.
fn touch_high_memory(info: &BootInfo) {
    if info.high_mem_size == 0 {
        println!("testguest: high memory: none (--memory is at most 3G)");
        return;
    }
    let (start, end) = (
        info.high_mem_start,
        info.high_mem_start + info.high_mem_size,
    );
    let pages = [start, end - 4096];
    for (i, &page) in pages.iter().enumerate() {
        let p = page as *mut u64;
        for w in 0..512u64 {
            // SAFETY: the VMM identity-maps all RAM, this range included,
            // writable from ring 3 (hypercall_abi::boot); nothing else
            // uses it.
            unsafe {
                p.add(w as usize)
                    .write_volatile(page ^ w ^ (i as u64) << 60)
            };
        }
    }
    for (i, &page) in pages.iter().enumerate() {
        let p = page as *const u64;
        for w in 0..512u64 {
            // SAFETY: as above.
            let got = unsafe { p.add(w as usize).read_volatile() };
            if got != page ^ w ^ (i as u64) << 60 {
                println!(
                    "testguest: high memory word {:#x} reads {:#x}: FAILED",
                    page + 8 * w,
                    got
                );
                return;
            }
        }
    }
    println!(
        "testguest: high memory [{:#x}, {:#x}) pages {:#x} {:#x} ok",
        start, end, pages[0], pages[1]
    );
}

mod console;
mod disk;
mod hostile;
mod net;
mod options;
mod staged;

use options::{parse_cmdline, staged_config};

/// xorshift64 (Marsaglia, "Xorshift RNGs", J. Stat. Softw. 2003; shifts 13, 7, 17).
fn xorshift64(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// Words in the workload's table: 4096 × 8 bytes = 32 KiB per vCPU.
const TABLE_WORDS: usize = 4096;

/// The per-vCPU workload: fills a 32 KiB table from a xorshift64 stream seeded
/// by the vCPU index, then does `iters` data-dependent read-modify-writes and
/// folds them into a checksum. The end-to-end tests recompute it on the host.
fn workload(vcpu: u64, iters: u64) -> u64 {
    let mut table = [0u64; TABLE_WORDS];
    let mut x = 0x5354_4147_4556_4d31 ^ (vcpu + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for word in table.iter_mut() {
        x = xorshift64(x);
        *word = x;
    }
    let mut sum = 0u64;
    for i in 0..iters {
        x = xorshift64(x);
        let j = (x % TABLE_WORDS as u64) as usize;
        table[j] = table[j].rotate_left(7) ^ i;
        sum = sum.rotate_left(5) ^ table[j];
    }
    table.iter().fold(sum, |acc, w| acc.wrapping_add(*w))
}

/// Set once vCPU 0 has printed the banner; other vCPUs print after it.
static BANNER_DONE: AtomicBool = AtomicBool::new(false);

/// vCPUs that have finished their work.
static DONE: AtomicU32 = AtomicU32::new(0);

/// Entry of every vCPU, in ring 3: `vcpu` is its index (RDI), `boot` the GPA
/// of the boot info (RSI), identity-mapped.
extern "C" fn rust_main(vcpu: u64, boot: *const BootInfo) -> ! {
    // SAFETY: the VMM writes a BootInfo at this identity-mapped GPA before any
    // vCPU starts; it is only read.
    let info = unsafe { boot.read_volatile() };
    if !info.is_valid() {
        println!("testguest: bad boot info (magic {:#x})", info.magic);
        shutdown(3);
    }
    // SAFETY: the VMM wrote `cmdline_len` bytes at `cmdline_gpa`, inside RAM.
    let raw = unsafe {
        core::slice::from_raw_parts(info.cmdline_gpa as *const u8, info.cmdline_len as usize)
    };
    let cmdline = core::str::from_utf8(raw).unwrap_or("");
    let opts = match parse_cmdline(cmdline) {
        Ok(opts) => opts,
        Err(word) => {
            // Only vCPU 0 ends the VM, after its message is out.
            if vcpu != 0 {
                stop_vcpu();
            }
            println!("testguest: bad command-line word '{}'", word);
            shutdown(4);
        }
    };
    if vcpu == 0 {
        println!(
            "stagevm testguest: {} vCPUs, {} MiB, tsc {} kHz, cmdline \"{}\"",
            info.num_vcpus,
            info.mem_size >> 20,
            info.tsc_khz,
            cmdline
        );
        if opts.fault {
            println!("testguest: executing hlt in ring 3 (expect a triple fault)");
            // SAFETY: deliberately faults; the VMM ends the VM.
            unsafe { asm!("hlt") };
        }
        staged::hopper::configure(opts.hopper, opts.hops, opts.hop_work, opts.hop_pass);
        staged::setup(
            &info,
            opts.ring,
            opts.counters,
            opts.latency,
            opts.timed_every,
            opts.abuse.then_some(hostile::abuse::bad_registers),
            opts.footprint,
        );
        if opts.abuse {
            hostile::abuse::corrupt_ring(opts.ring);
        }
        if let Some(p) = opts.footprint {
            println!(
                "testguest: footprint workload: {} stages, {} functions per stage, {} bytes of code, {} calls per stage, {} data words per thread",
                p.stages,
                p.funcs,
                stage_workload::code_bytes(p.stages, p.funcs),
                p.calls,
                p.data_words
            );
        }
        if opts.bench {
            staged::channel_microbench(0, info.tsc_khz);
        }
        if let Some((base, size)) = opts.virtio.filter(|_| !opts.hostile.is_active()) {
            disk::run(base, size, opts.disk_chunk, opts.disk_write, info.tsc_khz);
        }
        if opts.console {
            console::echo_lines(opts.console_after_ms, info.tsc_khz);
        }
        if opts.highmem {
            touch_high_memory(&info);
        }
        match (opts.net, opts.net_mode) {
            (Some((base, size)), Some(mode)) => net::run(mode, base, size, info.tsc_khz),
            (None, Some(_)) => println!("testguest: a net mode but no network card"),
            _ => {}
        }
        BANNER_DONE.store(true, Ordering::Release);
    }
    let checksum = workload(vcpu, opts.iters);
    // The banner comes first on the console, whichever vCPU finishes first.
    while !BANNER_DONE.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
    println!(
        "vcpu {}: ring {}, iters {}, checksum {:#018x}",
        vcpu,
        cpl(),
        opts.iters,
        checksum
    );
    if opts.hostile.is_active() {
        hostile::run(
            vcpu as u32,
            &info,
            opts.hostile,
            (opts.virtio, opts.net),
            opts.exit,
        );
    }
    if let Some(cfg) = staged_config(&opts, vcpu as u32, info.num_vcpus) {
        staged::run_vcpu(vcpu as u32, info.num_vcpus, &cfg, info.tsc_khz);
    }
    if DONE.fetch_add(1, Ordering::AcqRel) + 1 == info.num_vcpus {
        staged::print_counts();
        println!("testguest: all {} vCPUs done", info.num_vcpus);
        if opts.hold {
            println!("testguest: holding until the VMM ends the VM");
        } else {
            shutdown(opts.exit);
        }
    }
    if opts.hold {
        staged::hold(vcpu as u32);
    }
    stop_vcpu();
}

#[panic_handler]
fn panic(panic: &core::panic::PanicInfo) -> ! {
    CONSOLE_LOCK.store(false, Ordering::Release);
    println!("testguest: panic: {}", panic);
    shutdown(101);
}
