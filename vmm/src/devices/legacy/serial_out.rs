//! Console output that never blocks a vCPU (`--serial tty`: stdout).
//!
//! A vCPU writes COM1's bytes with the UART's lock held. Written straight
//! to stdout, a pipe nobody reads (`stagevm … | sleep 30`) blocked the
//! vCPU in `write(2)` with that lock held, and with it the console's input
//! thread and the exit path, which take the same lock. Now a vCPU only
//! appends to a bounded buffer ([`CAPACITY`]); bytes a full buffer cannot
//! take are dropped and counted ([`super::console::DROPPED`], the report's
//! `serial_dropped_bytes`), as a full pty or a slow socket client already
//! lose them. The `serial-out` helper writes the buffer to stdout and may
//! block there as long as the reader pleases: nothing waits for it but the
//! end of the run, which gives it [`FLUSH_TIMEOUT`] to write what is left
//! ([`Flusher::flush`]) and then counts the rest as dropped. The helper is
//! never joined; it ends with the process.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;

use super::console::DROPPED;

/// Bytes of output buffered for the helper (a few screens; a guest's
/// whole boot log at 115200 baud takes seconds to print).
pub const CAPACITY: usize = 64 * 1024;
/// How long the end of the run waits for the helper to write what is
/// buffered.
pub const FLUSH_TIMEOUT: Duration = Duration::from_millis(500);
/// Most bytes the helper takes out of the buffer per `write(2)`.
const CHUNK: usize = 16 * 1024;

#[derive(Default)]
struct State {
    buf: VecDeque<u8>,
    /// The helper holds bytes it took and has not finished writing.
    writing: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when the buffer is empty and nothing is being written.
    drained: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The UART's side: a writer that appends and never waits.
pub struct Buffered {
    shared: Arc<Shared>,
    /// Written when the buffer goes from empty to not empty.
    ready: EventFd,
}

/// The `serial-out` helper's side: the buffer, its event and the
/// descriptor written (a duplicate of stdout).
pub struct Drain {
    shared: Arc<Shared>,
    ready: EventFd,
    out: OwnedFd,
}

/// The end of the run's handle: waits for the buffer to be written.
#[derive(Clone)]
pub struct Flusher(Arc<Shared>);

/// A buffered console writing to `out`. Errors: the event cannot be made.
pub fn buffered(out: OwnedFd) -> io::Result<(Buffered, Drain, Flusher)> {
    let shared = Arc::new(Shared::default());
    let ready = EventFd::new(libc::EFD_NONBLOCK)?;
    Ok((
        Buffered {
            shared: shared.clone(),
            ready: ready.try_clone()?,
        },
        Drain {
            shared: shared.clone(),
            ready,
            out,
        },
        Flusher(shared),
    ))
}

impl Write for Buffered {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let mut st = self.shared.lock();
        let was_empty = st.buf.is_empty();
        let n = bytes.len().min(CAPACITY.saturating_sub(st.buf.len()));
        st.buf.extend(&bytes[..n]);
        drop(st);
        if n < bytes.len() {
            DROPPED.fetch_add((bytes.len() - n) as u64, Ordering::Relaxed);
        }
        if was_empty && n > 0 {
            // A non-blocking eventfd: a write only fails when the counter
            // is saturated, and then the helper is woken anyway.
            let _ = self.ready.write(1);
        }
        Ok(bytes.len())
    }

    /// Nothing: the UART flushes after every byte, and the helper writes
    /// as soon as it can.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drain {
    /// The `serial-out` loop: writes what the buffer holds whenever it
    /// fills. It does not stop at `exit` (the vCPUs' last bytes come after
    /// it): it serves until the process ends. Errors: the epoll set cannot
    /// be made or waited on.
    pub fn serve(self, exit: &EventFd) -> io::Result<()> {
        const EXIT: u64 = 0;
        const READY: u64 = 1;
        let mut poller = stagevm_api::poll::Poller::new(&[
            (exit.as_raw_fd(), EXIT),
            (self.ready.as_raw_fd(), READY),
        ])?;
        let mut chunk = Vec::with_capacity(CHUNK);
        loop {
            let ready = poller.wait()?;
            if ready.contains(&EXIT) {
                // Readable for good: stop watching it.
                poller.remove(exit.as_raw_fd())?;
            }
            let _ = self.ready.read();
            loop {
                {
                    let mut st = self.shared.lock();
                    if st.buf.is_empty() {
                        st.writing = false;
                        self.shared.drained.notify_all();
                        break;
                    }
                    st.writing = true;
                    let n = st.buf.len().min(CHUNK);
                    chunk.clear();
                    chunk.extend(st.buf.drain(..n));
                }
                if !write_all(&self.out, &chunk) {
                    // The reader is gone (EPIPE) or the descriptor failed:
                    // the bytes are lost, counted.
                    DROPPED.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Writes all of `bytes` to `fd` (blocking), retrying on `EINTR`; false
/// on any other error.
fn write_all(fd: &OwnedFd, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        // SAFETY: write(2) reads at most `bytes.len()` bytes of `bytes`.
        let n = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        } else {
            return false;
        }
    }
    true
}

impl Flusher {
    /// Waits at most `timeout` for the buffer to be written; what is still
    /// buffered then is dropped and counted. Returns the bytes dropped.
    pub fn flush(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut st = self.0.lock();
        while !st.buf.is_empty() || st.writing {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let lost = st.buf.len() as u64;
                st.buf.clear();
                DROPPED.fetch_add(lost, Ordering::Relaxed);
                return lost;
            }
            st = self
                .0
                .drained
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe2(2) fills two descriptors, owned below.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both were just created and are owned by nothing else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    #[test]
    fn a_stalled_reader_never_blocks_the_writer_and_losses_are_counted() {
        let (read_end, write_end) = pipe();
        let (mut out, drain, flusher) = buffered(write_end).unwrap();
        let exit = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let exit2 = exit.try_clone().unwrap();
        std::thread::spawn(move || drain.serve(&exit2));
        let before = DROPPED.load(Ordering::Relaxed);
        // 1 MiB into a 64 KiB pipe nobody reads, plus the 64 KiB buffer:
        // every write returns at once.
        let t = Instant::now();
        for _ in 0..1024 {
            out.write_all(&[b'x'; 1024]).unwrap();
            out.flush().unwrap();
        }
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        // The helper has filled the pipe and waits in write(2); what comes
        // now stays buffered (had the helper started late, the buffer alone
        // would have fitted in the pipe).
        std::thread::sleep(Duration::from_millis(100));
        out.write_all(&[b'y'; CAPACITY]).unwrap();
        exit.write(1).unwrap();
        // Nothing can be written now: the flush gives up and counts.
        let lost = flusher.flush(Duration::from_millis(100));
        assert!(lost > 0, "{lost}");
        let dropped = DROPPED.load(Ordering::Relaxed) - before;
        assert!(dropped >= (1 << 20) - 2 * CAPACITY as u64, "{dropped}");
        drop(read_end);
    }

    #[test]
    fn a_reader_gets_every_byte_in_order() {
        let (read_end, write_end) = pipe();
        let (mut out, drain, flusher) = buffered(write_end).unwrap();
        let exit = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        std::thread::spawn(move || drain.serve(&exit));
        let reader = std::thread::spawn(move || {
            let mut f = std::fs::File::from(read_end);
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while got.len() < 10_000 {
                let n = io::Read::read(&mut f, &mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            got
        });
        let sent: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        for b in &sent {
            out.write_all(std::slice::from_ref(b)).unwrap();
        }
        assert_eq!(flusher.flush(Duration::from_secs(5)), 0);
        assert_eq!(reader.join().unwrap(), sent);
    }
}
