//! The test guest's command line (the words are documented at the top of
//! `main.rs`): [`Options`] and their parser, and the staged phase's
//! configuration they give each vCPU.

use super::*;

/// Options from the command line.
pub(crate) struct Options {
    pub(crate) iters: u64,
    pub(crate) exit: u32,
    pub(crate) fault: bool,
    pub(crate) threads: usize,
    pub(crate) requests: u64,
    pub(crate) work: u64,
    pub(crate) weights: [u64; 3],
    pub(crate) phase: bool,
    /// The footprint workload, with `workload=footprint`.
    pub(crate) footprint: Option<stage_workload::Params>,
    pub(crate) ring: u32,
    /// Lay out per-vCPU stage counters (`counters=0`: a v1.1 guest).
    pub(crate) counters: bool,
    /// With counters, lay out request-latency histograms too (`latency=0`:
    /// a minor-3 guest).
    pub(crate) latency: bool,
    /// Open-loop load: `arrival=RATE`, `arrival_dist=`, `queue=`.
    pub(crate) arrival: Option<staged::ArrivalConfig>,
    /// One timed visit in this many (0: the agent's default).
    pub(crate) timed_every: u64,
    pub(crate) abuse: bool,
    pub(crate) bench: bool,
    /// `threads=` was given (hopper's default is one thread guest-wide).
    pub(crate) threads_given: bool,
    /// Hopper's stages (0: off) and switches per pass.
    pub(crate) hopper: u32,
    pub(crate) hops: u64,
    /// `hop_work=`: hopper's mixing iterations after every switch.
    pub(crate) hop_work: u64,
    /// `hop_pass=`: which of hopper's passes run.
    pub(crate) hop_pass: staged::hopper::Passes,
    /// The first virtio-mmio block device (GPA, bytes), from `virtio_mmio.device=`.
    pub(crate) virtio: Option<(u64, usize)>,
    /// The first virtio-mmio network card (GPA, bytes).
    pub(crate) net: Option<(u64, usize)>,
    /// `console=1`: answer lines typed on the serial console.
    pub(crate) console: bool,
    /// `console_after=MS`: leave the console unread for MS ms first.
    pub(crate) console_after_ms: u64,
    /// `highmem=1`: write and read back RAM above 4 GiB.
    pub(crate) highmem: bool,
    /// `netecho=1`, `netsink=1`, `netsource=SIZE:COUNT`: what the guest
    /// does on its network card.
    pub(crate) net_mode: Option<net::Mode>,
    pub(crate) disk_write: bool,
    pub(crate) disk_chunk: usize,
    pub(crate) idle: staged::IdleConfig,
    pub(crate) switch_cost: u64,
    /// Attacks on the VMM (`hostile=`).
    pub(crate) hostile: hostile::Hostile,
    /// `hold=1`: park every vCPU at the end instead of shutting down.
    pub(crate) hold: bool,
}

/// `A,B,C`: exactly three unsigned integers.
fn parse_weights(value: &str) -> Option<[u64; 3]> {
    let mut weights = [0u64; 3];
    let mut parts = value.split(',');
    for w in weights.iter_mut() {
        *w = parts.next()?.parse().ok()?;
    }
    parts.next().is_none().then_some(weights)
}

pub(crate) fn parse_cmdline(cmdline: &str) -> Result<Options, &str> {
    let mut opts = Options {
        iters: 1_000_000,
        exit: 0,
        fault: false,
        threads: 2,
        requests: 100,
        work: 0,
        weights: [1, 1, 1],
        phase: false,
        footprint: None,
        ring: 256,
        counters: true,
        latency: true,
        arrival: None,
        timed_every: 0,
        abuse: false,
        bench: false,
        threads_given: false,
        hopper: 0,
        hops: 100_000,
        hop_work: 0,
        hop_pass: staged::hopper::Passes::Both,
        virtio: None,
        net: None,
        console: false,
        console_after_ms: 0,
        highmem: false,
        net_mode: None,
        disk_write: false,
        disk_chunk: 64 * 1024,
        idle: staged::IdleConfig::default(),
        switch_cost: 0,
        hostile: Default::default(),
        hold: false,
    };
    let mut fp = stage_workload::Params {
        stages: 2,
        funcs: 1024,
        calls: 400,
        data_words: 0,
    };
    let mut fp_word = None;
    // `arrival=`'s rate (0: closed loop), its gaps and the queue.
    let mut arrival = (
        0u64,
        stage_workload::arrivals::ArrivalDist::Poisson,
        1024usize,
        stage_workload::arrivals::Phases::default(),
    );
    // The words that set stages, funcs and calls, to name a bad one.
    let mut fp_words = ["", "", ""];
    for word in cmdline.split_ascii_whitespace() {
        let (key, value) = word.split_once('=').ok_or(word)?;
        match key {
            "workload" if value == "footprint" => fp_word = Some(word),
            "workload" if value == "default" => fp_word = None,
            "stages" => (fp.stages, fp_words[0]) = (value.parse().map_err(|_| word)?, word),
            "funcs" => (fp.funcs, fp_words[1]) = (value.parse().map_err(|_| word)?, word),
            "calls" => (fp.calls, fp_words[2]) = (value.parse().map_err(|_| word)?, word),
            "data" => fp.data_words = value.parse().map_err(|_| word)?,
            "iters" => opts.iters = value.parse().map_err(|_| word)?,
            "exit" => opts.exit = value.parse().map_err(|_| word)?,
            "fault" => opts.fault = value == "1",
            "threads" => {
                opts.threads = value.parse().map_err(|_| word)?;
                opts.threads_given = true;
            }
            "hopper" => match value.parse() {
                Ok(n @ (0 | 2 | 3)) => opts.hopper = n,
                _ => return Err(word),
            },
            "hop_work" => opts.hop_work = value.parse().map_err(|_| word)?,
            "hop_pass" => opts.hop_pass = staged::hopper::Passes::parse(value).ok_or(word)?,
            "hops" => match value.parse() {
                Ok(n) if n > 0 => opts.hops = n,
                _ => return Err(word),
            },
            "requests" => opts.requests = value.parse().map_err(|_| word)?,
            "work" => opts.work = value.parse().map_err(|_| word)?,
            "weights" => opts.weights = parse_weights(value).ok_or(word)?,
            "phase" => opts.phase = value == "1",
            "ring" => opts.ring = value.parse().map_err(|_| word)?,
            "timed_every" => opts.timed_every = value.parse().map_err(|_| word)?,
            "counters" => match value {
                "0" => opts.counters = false,
                "1" => opts.counters = true,
                _ => return Err(word),
            },
            "latency" => match value {
                "0" => opts.latency = false,
                "1" => opts.latency = true,
                _ => return Err(word),
            },
            "arrival" => arrival.0 = value.parse().map_err(|_| word)?,
            "arrival_dist" => {
                arrival.1 = stage_workload::arrivals::ArrivalDist::parse(value).ok_or(word)?
            }
            "queue" => match value.parse() {
                Ok(n @ 1..=staged::arrivals::QUEUE_MAX) => arrival.2 = n,
                _ => return Err(word),
            },
            "phases" => arrival.3 = parse_phases(value).ok_or(word)?,
            "idle_spin_us" => opts.idle.shared_us = value.parse().map_err(|_| word)?,
            "owned_idle_us" => opts.idle.owned_us = value.parse().map_err(|_| word)?,
            "spill_us" => opts.idle.spill_us = value.parse().map_err(|_| word)?,
            "switch_cost" => opts.switch_cost = value.parse().map_err(|_| word)?,
            "abuse" => opts.abuse = value == "1",
            "hostile" => opts.hostile = hostile::Hostile::parse(value).ok_or(word)?,
            "bench" => opts.bench = value == "1",
            "hold" => opts.hold = value == "1",
            "virtio_mmio.device" => {
                let device = disk::parse_device(value).ok_or(word)?;
                // Further devices of a kind are not used by this guest.
                match net::device_id(device.0) {
                    1 if opts.net.is_none() => opts.net = Some(device),
                    1 => {}
                    _ if opts.virtio.is_none() => opts.virtio = Some(device),
                    _ => {}
                }
            }
            "console" => opts.console = value == "1",
            "console_after" => opts.console_after_ms = value.parse().map_err(|_| word)?,
            "highmem" => opts.highmem = value == "1",
            "netecho" | "netsink" | "netsource" => {
                opts.net_mode = net::Mode::parse(key, value).ok_or(word)?
            }
            "diskwrite" => opts.disk_write = value == "1",
            "diskchunk" => opts.disk_chunk = value.parse().map_err(|_| word)?,
            _ => return Err(word),
        }
    }
    if arrival.0 > 0 {
        opts.arrival = Some(staged::ArrivalConfig {
            rate: arrival.0,
            dist: arrival.1,
            queue: arrival.2,
            phases_ms: arrival.3,
        });
    }
    if let Some(word) = fp_word {
        if opts.hopper != 0 {
            return Err(word);
        }
        fp.validate().map_err(|e| {
            let bad = match e {
                stage_workload::ParamError::Stages(_) => fp_words[0],
                stage_workload::ParamError::Funcs(_) => fp_words[1],
                stage_workload::ParamError::Calls => fp_words[2],
            };
            if bad.is_empty() {
                word
            } else {
                bad
            }
        })?;
        opts.footprint = Some(fp);
    }
    Ok(opts)
}

/// The staged phase's parameters on `vcpu` of `num_vcpus`, or `None` when
/// the phase is skipped (`requests=0` without hopper). With `hopper=N` a
/// thread's requests are its switches per pass: `hops=` shared among all
/// threads, one thread on vCPU 0 unless `threads=` was given.
pub(crate) fn staged_config(
    opts: &Options,
    vcpu: u32,
    num_vcpus: u32,
) -> Option<staged::StagedConfig> {
    let (threads, requests) = if opts.hopper == 0 {
        (opts.threads, opts.requests)
    } else if opts.threads_given {
        let per_vcpu = opts.threads.min(staged::MAX_THREADS_PER_VCPU);
        let total = (per_vcpu as u64 * u64::from(num_vcpus)).max(1);
        (per_vcpu, (opts.hops / total).max(1))
    } else {
        (usize::from(vcpu == 0), opts.hops)
    };
    (requests > 0).then_some(staged::StagedConfig {
        threads,
        requests,
        work: opts.work,
        weights: opts.weights,
        phase: opts.phase,
        idle: opts.idle,
        switch_cost: opts.switch_cost,
        // Hopper's switches are not requests.
        arrival: opts.arrival.filter(|_| opts.hopper == 0),
    })
}

/// `phases=ON:OFF[:OFFSET[:LOW]]` (ms; ON ≥ 1; LOW ≤ 100): busy and idle
/// windows of the open loop, the first busy window from OFFSET; with LOW
/// the other windows run at LOW % of the rate instead of idle.
fn parse_phases(value: &str) -> Option<stage_workload::arrivals::Phases> {
    let mut it = value.split(':').map(|v| v.parse::<u64>().ok());
    let on = it.next()??;
    let off = it.next()??;
    let offset = it.next().unwrap_or(Some(0))?;
    let low_pct = it.next().unwrap_or(Some(0))?;
    (on > 0 && low_pct <= 100 && it.next().is_none()).then_some(stage_workload::arrivals::Phases {
        on,
        off,
        offset,
        low_pct,
    })
}
