//! The host side of the libstage test: a memfd-backed area under the VMM's
//! real stage device and stage scheduling ([`Host`]), playing this VMM or
//! an older one ([`HostKind`]), with the C program started against it
//! ([`Host::child`]).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use host_sched::config::{Config, Overrides, Resolved};
use host_sched::cpuset::CpuSet;
use host_sched::policy::{plan_from_assignment, Plan};
use host_sched::topology::Topology;
use hypercall_abi::stage::{
    AreaHeader, Layout, RingHeader, StageMap, Status, VcpuLatency, DOORBELL_REGISTER,
    DOORBELL_STATUS, STAGE_MAP_OFFSET,
};
use stage_device::sched::StageSched;
use stage_device::stage::{host_tsc, StageDevice};
use stagevm_report::ChannelReport;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::program::{binaries, Driver};

/// Guest-physical address of the area (above the VMM's fixed structures).
const AREA_GPA: u64 = 0x20_0000;
/// Stage names, in stage-id order (the C program registers the same).
pub const STAGES: [&str; 2] = ["parse", "execute"];

/// The host side: a memfd-backed guest memory region holding the area, the
/// VMM's stage device over it, and the VMM's stage scheduling running its
/// real `stage-sched` loop on a thread.
pub struct Host {
    pub dev: Arc<StageDevice>,
    sched: Arc<StageSched>,
    resolved: Resolved,
    pub memfd: File,
    len: u64,
    vcpus: u32,
    ring_entries: u32,
    /// Plays a v1.1 host ([`Host::register_as_old_host`]): every map it
    /// publishes says minor 1.
    old_host: bool,
    /// The exit `EventFd` the loop waits on (as the VM's).
    exit: Arc<EventFd>,
    drainer: Option<std::thread::JoinHandle<()>>,
}

impl Host {
    /// Room for rings and counters (libstage then lays out no latency
    /// blocks: they do not fit) and a device that gives no TSC rate.
    pub fn new(vcpus: u32, ring_entries: u32, policy: &str) -> Self {
        Self::build(vcpus, ring_entries, policy, false, 0)
    }

    /// Room for libstage's whole layout, with the latency blocks (ABI minor
    /// 4), and a device that gives the guest `tsc_khz` (requests are timed
    /// only with a TSC rate).
    pub fn with_latency(vcpus: u32, ring_entries: u32, policy: &str, tsc_khz: u64) -> Self {
        Self::build(vcpus, ring_entries, policy, true, tsc_khz)
    }

    fn build(vcpus: u32, ring_entries: u32, policy: &str, latency: bool, tsc_khz: u64) -> Self {
        let layout = Layout::new(vcpus, STAGES.len() as u32, ring_entries).unwrap();
        let layout = if latency {
            layout.with_latency()
        } else {
            layout.with_counters()
        };
        let len = layout.area_size();
        // No MFD_CLOEXEC: the C child inherits the descriptor.
        // SAFETY: a NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"stagevm-area".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor we own.
        let memfd = unsafe { File::from_raw_fd(fd) };
        memfd.set_len(len).unwrap();
        let memory = GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(AREA_GPA),
            len as usize,
            Some(FileOffset::new(memfd.try_clone().unwrap(), 0)),
        )])
        .unwrap();
        let dev = Arc::new(StageDevice::new(
            Arc::new(memory),
            AREA_GPA + len,
            vcpus,
            tsc_khz,
            1000,
        ));
        let cores = CpuSet::from_iter(0..vcpus as usize).to_string();
        let toml = format!(
            "[host]\ncores = \"{cores}\"\n[policy]\nname = \"{policy}\"\n\
             [[stage]]\nname = \"parse\"\nmin_cores = 1\n\
             [[stage]]\nname = \"execute\"\nmin_cores = 1\n"
        );
        let config = Config::from_toml(&toml, "libstage test").unwrap();
        let topo = Topology::detect().unwrap();
        let setup = host_sched::vm::Setup::new(config, &Overrides::default(), topo).unwrap();
        let resolved = setup.resolved.clone();
        let sched = StageSched::new(&setup, vcpus, Some(dev.clone())).unwrap();
        Self {
            dev,
            sched,
            resolved,
            memfd,
            len,
            vcpus,
            ring_entries,
            old_host: false,
            exit: Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()),
            drainer: None,
        }
    }

    /// The doorbell REGISTER a guest's module sends, from vCPU 0, handled as
    /// the vCPU run loop does: a successful one goes on to the scheduler,
    /// which publishes the first map. Also checks the names it declared.
    /// Like the module, it first writes the guest TSC of the REGISTER into
    /// the header (`register_tsc`: libstage laid the area out a little
    /// earlier, and here the host and the "guest" share the TSC).
    pub fn register(&self) -> Status {
        self.write_u64(
            std::mem::offset_of!(AreaHeader, register_tsc) as u64,
            host_tsc(),
        );
        let pfn = (AREA_GPA >> 12) as u32;
        if let Some(registered) = self.dev.doorbell(0, DOORBELL_REGISTER, &pfn.to_le_bytes()) {
            assert_eq!(registered.names, STAGES);
            self.sched.on_register(&registered);
        }
        let mut st = [0u8; 4];
        self.dev.read_status(0, DOORBELL_STATUS, &mut st);
        Status::from_u32(u32::from_le_bytes(st)).unwrap()
    }

    /// REGISTER as a v1.1 host (ABI minor 1) handles it: it ignores the
    /// header's `flags` (a v1.1 host never read them), so the area is a
    /// rings-only area to it, and every map it publishes says minor 1.
    /// Simulated with the real device: the counters flag is hidden from it
    /// during the doorbell and put back for the guest afterwards, and the
    /// map's `minor` word is rewritten after each publish.
    fn register_as_old_host(&mut self) -> Status {
        let flags_at = std::mem::offset_of!(AreaHeader, flags) as u64;
        let flags = self.read_u64(flags_at & !7);
        let shift = 8 * (flags_at & 7);
        self.write_u64(flags_at & !7, flags & !(0xffff_ffff << shift));
        let status = self.register();
        self.write_u64(flags_at & !7, flags);
        self.old_host = true;
        self.old_minor();
        status
    }

    /// An old host's minor in the published map (see
    /// [`Host::register_as_old_host`]).
    fn old_minor(&self) {
        if self.old_host {
            self.set_map_minor(1);
        }
    }

    /// Makes the published map say `minor` (a host of that minor, for the
    /// guest; the device itself is this VMM's). The next publish undoes it.
    pub fn set_map_minor(&self, minor: u64) {
        let at = STAGE_MAP_OFFSET + std::mem::offset_of!(StageMap, minor) as u64;
        self.write_u64(at, minor);
    }

    /// The header's `flags` as the guest wrote them.
    pub fn header_flags(&self) -> u32 {
        let at = std::mem::offset_of!(AreaHeader, flags) as u64;
        (self.read_u64(at & !7) >> (8 * (at & 7))) as u32
    }

    /// vCPU `vcpu`'s latency block as the guest wrote it, read from the
    /// area of `layout` (one with latency blocks).
    pub fn read_latency(&self, layout: &Layout, vcpu: u32) -> VcpuLatency {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; std::mem::size_of::<VcpuLatency>()];
        self.memfd
            .read_exact_at(&mut buf, layout.latency_offset(vcpu))
            .unwrap();
        let w: Vec<u64> = buf
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mut b = VcpuLatency {
            samples: w[0],
            sum_ns: w[1],
            countdown: w[2],
            ..Default::default()
        };
        b.agent.copy_from_slice(&w[3..6]);
        b.reserved.copy_from_slice(&w[6..16]);
        b.buckets.copy_from_slice(&w[16..]);
        b
    }

    /// Publishes a stage map through the device (as an old host, with
    /// minor 1).
    pub fn publish(&self, stage_vcpus: &[u64], owned: u64) {
        self.dev
            .publish(stage_vcpus, owned, hypercall_abi::stage::VisitPolicy::Fifo);
        self.old_minor();
    }

    fn read_u64(&self, offset: u64) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 8];
        self.memfd.read_exact_at(&mut buf, offset).unwrap();
        u64::from_le_bytes(buf)
    }

    fn write_u64(&self, offset: u64, value: u64) {
        use std::os::unix::fs::FileExt;
        self.memfd
            .write_all_at(&value.to_le_bytes(), offset)
            .unwrap();
    }

    /// `head` of every ring (libstage's layout: `ring_entries` per ring).
    pub fn ring_heads(&self) -> Vec<u64> {
        let l = Layout::new(self.vcpus, STAGES.len() as u32, self.ring_entries).unwrap();
        (0..self.vcpus)
            .map(|v| {
                self.read_u64(l.ring_offset(v) + std::mem::offset_of!(RingHeader, head) as u64)
            })
            .collect()
    }

    /// Runs the VMM's `stage-sched` loop on a thread, draining every
    /// `period`.
    pub fn start_draining(&mut self, period: Duration) {
        let (sched, exit) = (self.sched.clone(), self.exit.clone());
        self.drainer = Some(std::thread::spawn(move || {
            stagevm::sched_loop::run(&sched, period, &exit, stagevm::seccomp::SeccompMode::Off)
                .unwrap();
        }));
    }

    /// Stops the loop (the exit `EventFd`, as at VM exit) and drains what is
    /// left.
    pub fn finish(&mut self) -> ChannelReport {
        self.exit.write(1).unwrap();
        if let Some(t) = self.drainer.take() {
            t.join().unwrap();
        }
        self.sched.finish().0.unwrap()
    }

    /// The stage map as the guest sees it: (epoch, per-stage masks).
    pub fn map(&self) -> (u64, Vec<u64>) {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 8 * (1 + STAGES.len())];
        self.memfd
            .read_exact_at(&mut buf, STAGE_MAP_OFFSET)
            .unwrap();
        let words: Vec<u64> = buf
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        (words[0], words[1..].to_vec())
    }

    /// One 64-bit word of the stage map at byte `offset`.
    pub fn map_word(&self, offset: usize) -> u64 {
        self.read_u64(STAGE_MAP_OFFSET + offset as u64)
    }

    /// A host-sched plan giving core/vCPU `k` to stage `assignment[k]`.
    pub fn plan(&self, assignment: &[usize]) -> Plan {
        let names: Vec<String> = STAGES.iter().map(|s| s.to_string()).collect();
        let budgets = self.resolved.budgets_for(&names).unwrap();
        let ctx = self.resolved.context(self.vcpus, budgets);
        let a: Vec<Option<usize>> = assignment.iter().map(|s| Some(*s)).collect();
        plan_from_assignment(&ctx, &a)
    }

    pub fn child(&self, args: &[&str], env: &[(&str, &str)]) -> Driver {
        let child = self
            .command(args, env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the libstage test program");
        Driver::new(child)
    }

    /// The C program with `args` against this host's area (the memfd, its
    /// geometry and `env` in its environment), its CPUs limited to the
    /// vCPUs.
    pub fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(&binaries().e2e);
        cmd.args(args)
            .env("STAGEVM_FD", self.memfd.as_raw_fd().to_string())
            .env("STAGEVM_LEN", self.len.to_string())
            .env("STAGEVM_VCPUS", self.vcpus.to_string())
            .env("STAGEVM_RING_ENTRIES", self.ring_entries.to_string())
            .env_remove("STAGE_TRANSPORT")
            .env_remove("STAGE_TIMED_EVERY")
            .env_remove("STAGEVM_LATENCY")
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        // The child's CPUs are exactly the vCPUs 0..n: every CPU has a ring.
        let vcpus = self.vcpus as usize;
        // SAFETY: only async-signal-safe libc calls between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                for cpu in 0..vcpus {
                    libc::CPU_SET(cpu, &mut set);
                }
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.exit.write(1);
        if let Some(t) = self.drainer.take() {
            let _ = t.join();
        }
    }
}

/// Which host the C program meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostKind {
    /// This VMM (ABI minor 2): libstage reports through the counters.
    Counters,
    /// A v1.1 host ([`Host::register_as_old_host`]): libstage falls back to
    /// the rings.
    Old,
}

impl HostKind {
    pub fn mode(self) -> &'static str {
        match self {
            Self::Counters => "counters",
            Self::Old => "rings",
        }
    }

    pub fn register(self, host: &mut Host) -> Status {
        match self {
            Self::Counters => host.register(),
            Self::Old => host.register_as_old_host(),
        }
    }
}

/// The number n of CPUs this test uses as vCPUs 0..n: the allowed CPUs
/// counted from 0 without a gap, when there are at least 2.
pub fn host_vcpus() -> Option<u32> {
    let topo = Topology::detect().unwrap();
    let n = (0..64).take_while(|c| topo.allowed.contains(*c)).count();
    (n >= 2).then_some(n as u32)
}
