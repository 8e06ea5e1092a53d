//! `net-bench`: virtio-net throughput between the test guest and a peer on
//! the host side of its tap, in both directions, next to a veth pair between
//! two network namespaces measured in the same rounds; and what the guest's
//! frames cost in VM exits (queue notifications) and interrupts.
//!
//! Everything runs in network namespaces this process makes (`unshare`);
//! frames are raw Ethernet frames of a local experimental ethertype, never
//! IP, and never leave those namespaces. Each cell: `--seconds` of frames
//! of one size sent as fast as an `AF_PACKET` socket takes them (the
//! qdisc bypassed), counted by the receiver from its first frame to its
//! last: the guest (`netsink=1`, its TSC), or an `AF_PACKET` socket (the
//! guest's `netsource=SIZE:COUNT`, and both ends of the veth pair).
//! `--rounds` interleaved rounds; median (min–max). Run it alone.
//!
//! The namespaces, the tap and the `AF_PACKET` sockets are the test kit's
//! (`stagevm_testkit::net`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use stagevm_bench::load::{Meter, BUSY_CORES};
use stagevm_bench::stats::Spread;
use stagevm_bench::target::Target;
use stagevm_report::Report;
use stagevm_testkit::console::number_after;
use stagevm_testkit::net::{
    frame, mac_text, make_tap, stop_frame, Counted, Netns, Packet, GUEST_MAC, PEER_MAC,
};
use stagevm_testkit::{LaunchError, Lines, Running};

/// The second peer's (locally administered) MAC.
const PEER2_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x5e, 0x00, 0x03];
const TAP: &str = "svmbench0";
const VETH: [&str; 2] = ["nbveth0", "nbveth1"];
/// Target: the guest's throughput at 1514 bytes against the veth pair's.
const TARGET_RATIO: f64 = 0.5;
/// Target: VM exits per frame at saturation.
const TARGET_EXITS: f64 = 0.05;

/// virtio-net throughput against a veth pair.
#[derive(Parser, Debug)]
#[command(name = "net-bench", about)]
struct Args {
    #[command(flatten)]
    target: Target,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds of frames per cell.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Frame sizes (bytes, Ethernet header included, no FCS; 60…1514).
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 1514])]
    sizes: Vec<usize>,
}

/// One measured cell.
#[derive(Clone, Copy, Debug, Default)]
struct Cell {
    pps: f64,
    /// VM exits (queue notifications) per frame; NaN for veth.
    exits: f64,
    /// Interrupts raised per frame; NaN for veth.
    irqs: f64,
    /// Frames the receiver counted.
    frames: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Dir {
    /// Peer → guest.
    Rx,
    /// Guest → peer.
    Tx,
}

impl Dir {
    fn label(self) -> &'static str {
        match self {
            Dir::Rx => "peer → guest (rx)",
            Dir::Tx => "guest → peer (tx)",
        }
    }
}

/// The veth pair's two namespaces and the tap's.
struct Nets {
    veth: [Netns; 2],
    tap: Netns,
}

impl Nets {
    fn new() -> Result<Nets> {
        let veth = [Netns::new()?, Netns::new()?];
        veth[0].ip(&[
            "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1],
        ])?;
        let pid = veth[1].tid().to_string();
        veth[0].ip(&["link", "set", VETH[1], "netns", &pid])?;
        veth[0].ip(&["link", "set", VETH[0], "up"])?;
        veth[1].ip(&["link", "set", VETH[1], "up"])?;
        let tap = Netns::new()?;
        tap.run(|| make_tap(TAP))??;
        Ok(Nets { veth, tap })
    }
}

/// An `AF_PACKET` socket on interface `name` (the calling thread's
/// namespace) that sends past the qdisc and holds 4 MiB of received
/// frames; a receive gives up after 100 ms.
fn packet(name: &str) -> Result<Packet> {
    let p = Packet::open(name, Duration::from_millis(100))?;
    p.bypass_qdisc()?;
    p.set_recv_buffer(4 << 20)?;
    Ok(p)
}

/// veth: `from` sends for `time`, the other end counts.
fn veth(nets: &Nets, from: usize, size: usize, time: Duration) -> Result<Cell> {
    let to = 1 - from;
    let rx_if = VETH[to];
    let counter = nets.veth[to].spawn(move || -> Result<Counted> {
        let p = packet(rx_if)?;
        Ok(p.count(
            Some(PEER_MAC),
            Duration::from_secs(5),
            Duration::from_millis(300),
        ))
    })?;
    std::thread::sleep(Duration::from_millis(50));
    let tx_if = VETH[from];
    nets.veth[from].run(move || -> Result<()> {
        let p = packet(tx_if)?;
        p.blast(&mut frame(PEER2_MAC, PEER_MAC, size), time)?;
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..3 {
            p.send(&stop_frame(PEER2_MAC, PEER_MAC))?;
        }
        Ok(())
    })??;
    let c = counter
        .join()
        .map_err(|_| anyhow::anyhow!("counter panicked"))??;
    Ok(Cell {
        pps: c.pps(),
        exits: f64::NAN,
        irqs: f64::NAN,
        frames: c.frames,
    })
}

/// A running VM on the tap and its console lines; killed if dropped.
struct Vm {
    child: Running,
    lines: Lines,
    report: std::path::PathBuf,
}

impl Vm {
    /// Starts the test guest on the tap in `ns` with `cmdline` and waits
    /// for its card to be ready.
    fn start(args: &Args, ns: &Netns, cmdline: &str) -> Result<Vm> {
        let report = stagevm_testkit::temp_path("net-bench", "json");
        let vm = args
            .target
            .launch()
            .vcpus(1)
            .args(["--stage-cores", "1", "--housekeeping", "0"])
            .net(format!("tap={TAP},mac={}", mac_text(&GUEST_MAC)))
            .cmdline(cmdline)
            .report(&report)
            .stdin(Stdio::inherit())
            .stderr(Stdio::null());
        // Spawned from the namespace's thread: the VMM opens the tap there.
        let mut child = ns.run(move || vm.spawn())?.context("starting stagevm")?;
        let lines = child.stdout_lines()?;
        let vm = Vm {
            child,
            lines,
            report,
        };
        vm.wait_line("testguest: net ready", Duration::from_secs(30))?;
        Ok(vm)
    }

    /// The first console line starting with `prefix`, within `time`.
    fn wait_line(&self, prefix: &str, time: Duration) -> Result<String> {
        match self
            .lines
            .wait_for(prefix, time, &["net: ", "no network card"])
        {
            Ok(line) => Ok(line),
            Err(LaunchError::Refused { line, .. }) => bail!("the guest: {line}"),
            Err(e) => bail!("{e} from the guest"),
        }
    }

    /// Waits for the VM's end (30 s at most) and reads its report.
    fn finish(self) -> Result<Report> {
        let run = self.child.wait(Duration::from_secs(30))?;
        if !run.status.success() {
            bail!("stagevm exited with {}", run.status);
        }
        let report = Report::read(&self.report)
            .with_context(|| format!("the report {}", self.report.display()))?;
        let _ = std::fs::remove_file(&self.report);
        Ok(report)
    }
}

/// Exits and interrupts per frame from the VM's report.
fn costs(report: &Report, frames: u64) -> (f64, f64) {
    let Some(n) = report.nets.first() else {
        return (f64::NAN, f64::NAN);
    };
    let f = frames.max(1) as f64;
    (
        (n.rx_notifications + n.tx_notifications) as f64 / f,
        n.interrupts as f64 / f,
    )
}

/// Peer → guest: the peer sends for `time`, the guest counts.
fn vm_rx(args: &Args, nets: &Nets, size: usize, time: Duration) -> Result<Cell> {
    let vm = Vm::start(args, &nets.tap, "iters=1 requests=0 netsink=1")?;
    nets.tap.run(move || -> Result<()> {
        let p = packet(TAP)?;
        p.blast(&mut frame(GUEST_MAC, PEER_MAC, size), time)?;
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..3 {
            p.send(&stop_frame(GUEST_MAC, PEER_MAC))?;
        }
        Ok(())
    })??;
    let line = vm.wait_line("testguest: net sink", Duration::from_secs(10))?;
    let frames = number_after(&line, "net sink ").context("frames")? as u64;
    let ns = number_after(&line, " bytes in ").context("time")?;
    let report = vm.finish()?;
    let (exits, irqs) = costs(&report, frames);
    Ok(Cell {
        pps: if frames > 1 {
            (frames - 1) as f64 / (ns / 1e9)
        } else {
            f64::NAN
        },
        exits,
        irqs,
        frames,
    })
}

/// Guest → peer: the guest sends `count` frames, the peer counts.
fn vm_tx(args: &Args, nets: &Nets, size: usize, count: u64) -> Result<Cell> {
    let cmdline = format!("iters=1 requests=0 netsource={size}:{count}");
    let vm = Vm::start(args, &nets.tap, &cmdline)?;
    let counter = nets.tap.spawn(move || -> Result<Counted> {
        let p = packet(TAP)?;
        let go = {
            let mut f = frame(GUEST_MAC, PEER_MAC, 60);
            f[14..17].copy_from_slice(b"GO!");
            f
        };
        p.send(&go)?;
        Ok(p.count(
            Some(GUEST_MAC),
            Duration::from_secs(10),
            Duration::from_secs(1),
        ))
    })?;
    let c = counter
        .join()
        .map_err(|_| anyhow::anyhow!("counter panicked"))??;
    vm.wait_line("testguest: net source", Duration::from_secs(60))?;
    let report = vm.finish()?;
    let (exits, irqs) = costs(&report, c.frames);
    Ok(Cell {
        pps: c.pps(),
        exits,
        irqs,
        frames: c.frames,
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.rounds == 0 || args.seconds <= 0.0 {
        bail!("--rounds and --seconds must be positive");
    }
    if let Some(s) = args.sizes.iter().find(|s| !(60..=1514).contains(*s)) {
        bail!("--sizes: {s} is outside 60…1514 bytes");
    }
    for p in [&args.target.stagevm, &args.target.kernel] {
        if !p.exists() {
            bail!("{} is missing (just build)", p.display());
        }
    }
    let nets = Nets::new().context("network namespaces (needs root and /dev/net/tun)")?;
    let time = Duration::from_secs_f64(args.seconds);
    // The guest's transmit count per size: sized from a short probe so a
    // cell lasts about `time`.
    let mut counts = Vec::new();
    for &size in &args.sizes {
        let probe = vm_tx(&args, &nets, size, 20_000)?;
        let n = (probe.pps * args.seconds).clamp(20_000.0, 50_000_000.0) as u64;
        eprintln!(
            "net-bench: {size} B: guest sends {n} frames per cell (probe {:.0} frames/s)",
            probe.pps
        );
        counts.push(n);
    }
    type Key = (Dir, usize);
    let mut veth_cells: std::collections::BTreeMap<Key, Vec<Cell>> = Default::default();
    let mut vm_cells: std::collections::BTreeMap<Key, Vec<Cell>> = Default::default();
    let meter = Meter::start();
    let t0 = Instant::now();
    for round in 0..args.rounds {
        for (i, &size) in args.sizes.iter().enumerate() {
            for dir in [Dir::Rx, Dir::Tx] {
                let from = usize::from(dir == Dir::Tx);
                let v = veth(&nets, from, size, time)?;
                let g = match dir {
                    Dir::Rx => vm_rx(&args, &nets, size, time)?,
                    Dir::Tx => vm_tx(&args, &nets, size, counts[i])?,
                };
                eprintln!(
                    "net-bench: round {}/{} {size} B {:?}: veth {:.0} frames/s, guest {:.0} frames/s ({} frames), {:.3} exits/frame",
                    round + 1,
                    args.rounds,
                    dir,
                    v.pps,
                    g.pps,
                    g.frames,
                    g.exits
                );
                veth_cells.entry((dir, size)).or_default().push(v);
                vm_cells.entry((dir, size)).or_default().push(g);
            }
        }
    }
    let others = meter.others_cores();
    println!(
        "net-bench: {} interleaved rounds of {:.1} s per cell, {:.0} s; background load {:.2} cores{}",
        args.rounds,
        args.seconds,
        t0.elapsed().as_secs_f64(),
        others,
        if others > BUSY_CORES { " (BUSY: the figures are void)" } else { "" }
    );
    println!("1 vCPU on core 1, io-net0 on core 0 (--stage-cores 1 --housekeeping 0); frames/s median (min–max); Gbit/s of frame bytes at the median.\n");
    println!("| direction | frame | veth frames/s | veth Gbit/s | guest frames/s | guest Gbit/s | guest ÷ veth | exits/frame | interrupts/frame |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut ratio_1514 = Vec::new();
    let mut worst_exits: f64 = 0.0;
    for (key, gs) in &vm_cells {
        let (dir, size) = *key;
        let vs = &veth_cells[key];
        let vp = Spread::of(&vs.iter().map(|c| c.pps).collect::<Vec<_>>());
        let gp = Spread::of(&gs.iter().map(|c| c.pps).collect::<Vec<_>>());
        let ratio = Spread::of(
            &gs.iter()
                .zip(vs)
                .map(|(g, v)| g.pps / v.pps)
                .collect::<Vec<_>>(),
        );
        let exits = Spread::of(&gs.iter().map(|c| c.exits).collect::<Vec<_>>());
        let irqs = Spread::of(&gs.iter().map(|c| c.irqs).collect::<Vec<_>>());
        let gbit = |pps: f64| pps * size as f64 * 8.0 / 1e9;
        println!(
            "| {} | {size} B | {} | {:.2} | {} | {:.2} | {} | {} | {} |",
            dir.label(),
            vp.rate(),
            gbit(vp.med),
            gp.rate(),
            gbit(gp.med),
            ratio.ratio(),
            exits.plain(4),
            irqs.plain(4)
        );
        if size == 1514 {
            ratio_1514.push((dir, ratio.med));
        }
        worst_exits = worst_exits.max(exits.med);
    }
    println!("\n| target | measured | |");
    println!("|---|---|---|");
    for (dir, r) in ratio_1514 {
        println!(
            "| guest ≥ {TARGET_RATIO}× veth at 1514 B, {} | {r:.3}× | {} |",
            dir.label(),
            met(r >= TARGET_RATIO, others)
        );
    }
    println!(
        "| ≤ {TARGET_EXITS} exits per frame at saturation (worst cell) | {worst_exits:.4} | {} |",
        met(worst_exits <= TARGET_EXITS, others)
    );
    Ok(())
}

fn met(ok: bool, others: f64) -> &'static str {
    match (ok, others > BUSY_CORES) {
        (_, true) => "void (busy machine)",
        (true, _) => "met",
        (false, _) => "not met",
    }
}
