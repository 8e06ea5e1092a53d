//! `stagevm-hostd`: shares the host's stage cores among the stagevm VMs of
//! one directory (see the library's docs and docs/design.md, "Several VMs").

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use stagevm_api::server::{self, Listeners};
use stagevm_api::socket::{bind_metrics, ApiSocket};
use stagevm_hostd::{api::Shared, config::HostConfig, daemon::Daemon, lock};
use vmm_sys_util::eventfd::EventFd;

/// Shares the host's stage cores among the stagevm VMs whose API sockets
/// are in a directory, by their demand and the budgets of host.toml.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// host.toml: [host] cores, housekeeping, period_ms, hysteresis,
    /// timeout_ms; [[vm]] name, weight, min_cores, max_cores, cores.
    /// Without it: the isolated CPUs (else every allowed one), equal weights,
    /// 1 s periods.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where the VMs' API sockets are: a VM started with
    /// `--api-socket DIR/NAME.sock` is VM NAME.
    #[arg(long, value_name = "DIR", default_value = "/run/stagevm/vms")]
    vm_dir: PathBuf,
    /// The daemon's own API socket (`GET /api/v1/host`, `GET /metrics`;
    /// `stagevm-remote --api-socket PATH host`).
    #[arg(long, value_name = "PATH")]
    api_socket: Option<PathBuf>,
    /// Prometheus metrics over TCP: PORT (127.0.0.1) or ADDR:PORT.
    #[arg(long, value_name = "PORT|ADDR:PORT")]
    metrics_listen: Option<String>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let args = Args::parse();
    let topology = host_sched::topology::Topology::detect().context("reading this host's CPUs")?;
    let config = match &args.config {
        Some(path) => HostConfig::load(path, &topology)?,
        None => HostConfig::parse("", "(defaults)", &topology)?,
    };
    let _lock = lock::take(&args.vm_dir)?;
    // One thread so far: the socket is bound under a private umask.
    let mut socket = args
        .api_socket
        .as_deref()
        .map(ApiSocket::bind)
        .transpose()?;
    let metrics = args
        .metrics_listen
        .as_deref()
        .map(bind_metrics)
        .transpose()?;
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGINT);
    mask.add(Signal::SIGTERM);
    mask.thread_block().context("blocking SIGINT and SIGTERM")?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .context("signalfd")?;
    let shared = Arc::new(Shared::default());
    let exit = EventFd::new(libc::EFD_NONBLOCK).context("eventfd")?;
    let listeners = Listeners {
        unix: socket.as_mut().and_then(ApiSocket::take_listener),
        metrics,
    };
    let api = if listeners.unix.is_some() || listeners.metrics.is_some() {
        let (shared, exit) = (shared.clone(), exit.try_clone().context("eventfd")?);
        Some(
            std::thread::Builder::new()
                .name("api".into())
                .spawn(move || server::serve(listeners, shared, exit, || Ok(())))?,
        )
    } else {
        None
    };
    tracing::info!(
        "sharing stage cores {} among the VMs of {} every {:?}",
        config.cores,
        args.vm_dir.display(),
        config.period
    );
    let period = config.period;
    let mut daemon = Daemon::new(config, &args.vm_dir, args.api_socket.as_deref());
    let mut poller = stagevm_api::poll::Poller::new(&[(signals.as_raw_fd(), 0)])?;
    // A directory that cannot be read is logged when its error changes,
    // not every period.
    let mut last_error = None;
    loop {
        let started = std::time::Instant::now();
        let error = daemon.period().err().map(|e| e.to_string());
        if error != last_error {
            if let Some(e) = &error {
                tracing::warn!(
                    "--vm-dir {}: {e} (the VMs keep their cores)",
                    args.vm_dir.display()
                );
            }
            last_error = error;
        }
        *shared.0.lock().unwrap_or_else(|p| p.into_inner()) = daemon.view();
        if !poller
            .wait_for(Some(period.saturating_sub(started.elapsed())))?
            .is_empty()
        {
            tracing::info!("signal: stopping (the VMs keep their cores)");
            break;
        }
    }
    exit.write(1)?;
    if let Some(api) = api {
        match api.join() {
            Ok(r) => r.context("api thread")?,
            Err(_) => anyhow::bail!("api thread panicked"),
        }
    }
    Ok(())
}
