//! One VM as the daemon reaches it: its API socket, who serves it
//! ([`crate::peer`]: checked before anything it says is believed), what a
//! period reads from it (`GET /api/v1/stages`, and its vCPU threads' CPU
//! from `/proc`) and the cores it is given (`PUT /api/v1/stages.budgets`
//! with `[host]` only, so its stage budgets stay).

use std::path::{Path, PathBuf};
use std::time::Duration;

use host_sched::config::{BudgetsUpdate, CpuWeightUpdate, HostSection};
use host_sched::cpuset::CpuSet;
use stagevm_api::client::{Client, ClientError};
use stagevm_report::api::StagesView;

use crate::peer::{self, Peer, PeerError, Trust};

/// What one read of a VM found.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    /// Who serves its socket (trusted).
    pub peer: Peer,
    /// Its vCPU threads' CPU time so far (ns) and their count, measured
    /// from `/proc` ([`peer::vcpu_cpu`]), if readable.
    pub measured: Option<(u64, usize)>,
    /// Its stage cores now.
    pub cores: CpuSet,
    /// Its vCPUs' work CPU so far (ns; `sched.cpu.work_ns`), if the VM
    /// measures it.
    pub work_ns: Option<u64>,
    /// Its vCPU count, as it reports it.
    pub vcpus: usize,
    /// Policy periods with CPU figures so far, and the sum of their
    /// utilisations (`sched.cpu.periods` × `sched.cpu.utilisation`), if
    /// the VM measures them: two reads give the mean over the daemon's
    /// period.
    pub utilisation: Option<(u64, f64)>,
    /// The CPU weight it applies now (`sched.cpu_weight.weight`), if any:
    /// a restarted daemon adopts it as given.
    pub cpu_weight: Option<u32>,
}

/// Why a VM could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// Nothing listens on the socket any more: the VM ended.
    #[error("{0}: the VM is gone ({1})")]
    Gone(String, std::io::Error),
    /// The socket did not answer within the timeout.
    #[error("{0}: no answer within {1:?}")]
    Hung(String, Duration),
    /// The socket's peer is not trusted ([`Trust::check`]).
    #[error("{0}: not believed: {1}")]
    Untrusted(String, PeerError),
    /// Any other failure: a refused change, a bad answer.
    #[error("{0}: {1}")]
    Failed(String, String),
}

/// A VM's API socket.
pub struct Vm {
    name: String,
    socket: PathBuf,
    client: Client,
}

impl Vm {
    /// The VM behind `socket` (named by its stem). Errors: the client's
    /// runtime cannot be created.
    pub fn new(name: &str, socket: &Path) -> Result<Self, VmError> {
        let client =
            Client::new(socket).map_err(|e| VmError::Failed(name.into(), e.to_string()))?;
        Ok(Self {
            name: name.into(),
            socket: socket.to_path_buf(),
            client,
        })
    }

    /// Its socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>), VmError> {
        match self.client.request_within(method, path, body, timeout) {
            Ok(a) => Ok((a.status, a.body.to_vec())),
            Err(ClientError::Connect(_, e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ) =>
            {
                Err(VmError::Gone(self.name.clone(), e))
            }
            Err(ClientError::Timeout(t)) => Err(VmError::Hung(self.name.clone(), t)),
            Err(e) => Err(VmError::Failed(self.name.clone(), e.to_string())),
        }
    }

    /// Who serves its socket, checked against `trust`. Errors: gone, a
    /// full backlog ([`VmError::Hung`]), untrusted.
    pub fn identify(&self, trust: &Trust, timeout: Duration) -> Result<Peer, VmError> {
        let name = || self.name.clone();
        let p = peer::identify(&self.socket).map_err(|e| match e {
            PeerError::Gone(errno) => VmError::Gone(name(), std::io::Error::from(errno)),
            PeerError::Busy => VmError::Hung(name(), timeout),
            e => VmError::Failed(name(), e.to_string()),
        })?;
        trust.check(&p).map_err(|e| VmError::Untrusted(name(), e))?;
        Ok(p)
    }

    /// Checks who serves it ([`Vm::identify`]), then reads its stage
    /// cores, vCPUs and work CPU within `timeout`, and measures its vCPU
    /// threads' CPU. Errors: [`VmError`].
    pub fn read(&self, trust: &Trust, timeout: Duration) -> Result<Reading, VmError> {
        let peer = self.identify(trust, timeout)?;
        let (status, body) = self.request(
            "GET",
            "/api/v1/stages?timeline=0&decisions=0",
            Vec::new(),
            timeout,
        )?;
        let failed = |why: String| VmError::Failed(self.name.clone(), why);
        if status != 200 {
            return Err(failed(format!(
                "GET /api/v1/stages: {status} {}",
                String::from_utf8_lossy(&body)
            )));
        }
        let view: StagesView = serde_json::from_slice(&body)
            .map_err(|e| failed(format!("GET /api/v1/stages: {e}")))?;
        let cores = CpuSet::parse(&view.sched.stage_cores)
            .map_err(|e| failed(format!("stage cores '{}': {e}", view.sched.stage_cores)))?;
        Ok(Reading {
            measured: peer::vcpu_cpu(peer.pid),
            peer,
            cores,
            work_ns: view.sched.cpu.as_ref().map(|c| c.work_ns),
            utilisation: view
                .sched
                .cpu
                .as_ref()
                .map(|c| (c.periods, c.utilisation * c.periods as f64)),
            cpu_weight: view.sched.cpu_weight.as_ref().and_then(|w| w.weight),
            vcpus: view.sched.vcpus.len(),
        })
    }

    /// Gives it `cores` (and `housekeeping`, if the host sets them) from
    /// its next policy period on, within `timeout`: a budgets update
    /// without `[[stage]]` (its budgets and CPU weight are kept).
    /// Errors: [`VmError`]; a refusal carries the VM's message.
    pub fn give(
        &self,
        cores: &CpuSet,
        housekeeping: Option<&CpuSet>,
        timeout: Duration,
    ) -> Result<(), VmError> {
        let update = BudgetsUpdate {
            host: HostSection {
                cores: Some(cores.to_string()),
                housekeeping: housekeeping.map(|h| h.to_string()),
                cpu_weight: None,
            },
            stages: None,
        };
        self.put(
            "/api/v1/stages.budgets",
            &update,
            &format!("cores {cores}"),
            timeout,
        )
    }

    /// Gives it the CPU weight `weight` on the cores it shares (`None`
    /// takes it back), within `timeout`: its own change, which keeps the
    /// VM's policy state. Errors: [`VmError`]; a refusal carries the VM's
    /// message.
    pub fn weigh(&self, weight: Option<u32>, timeout: Duration) -> Result<(), VmError> {
        let what = format!(
            "CPU weight {}",
            weight.map_or("none".into(), |w| w.to_string())
        );
        let update = CpuWeightUpdate { weight };
        self.put("/api/v1/stages.cpu_weight", &update, &what, timeout)
    }

    /// `PUT path` with `update` as JSON, `202` expected; `what` names the
    /// change in the error.
    fn put(
        &self,
        path: &str,
        update: &impl serde::Serialize,
        what: &str,
        timeout: Duration,
    ) -> Result<(), VmError> {
        let body = serde_json::to_vec(update)
            .map_err(|e| VmError::Failed(self.name.clone(), e.to_string()))?;
        let (status, answer) = self.request("PUT", path, body, timeout)?;
        if status == 202 {
            Ok(())
        } else {
            Err(VmError::Failed(
                self.name.clone(),
                format!(
                    "refused {what}: {status} {}",
                    String::from_utf8_lossy(&answer)
                ),
            ))
        }
    }
}

/// The VMs' sockets in `dir`: every `NAME.sock` but `except` (the daemon's
/// own), sorted by name. Errors: the directory cannot be read.
pub fn discover(dir: &Path, except: Option<&Path>) -> std::io::Result<Vec<(String, PathBuf)>> {
    use std::os::unix::fs::FileTypeExt;
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if Some(path.as_path()) == except || !entry.file_type()?.is_socket() {
            continue;
        }
        if path.extension().is_some_and(|e| e == "sock") {
            if let Some(name) = path.file_stem().and_then(|s| s.to_str()) {
                found.push((name.to_string(), path.clone()));
            }
        }
    }
    found.sort();
    Ok(found)
}
