//! The serial console's host side (`--serial`): where COM1's output goes
//! and where its input comes from, in Cloud Hypervisor's terms.
//!
//! * `tty` — output to stdout; input from stdin when stdin is a terminal,
//!   which is then set to non-canonical, no-echo mode for the run (the
//!   guest echoes; Ctrl-C still stops the VMM) and restored at its end;
//! * `pty` — a new pseudo-terminal; its path is printed at start
//!   (`stagevm: serial on pty /dev/pts/N`) for `screen` or `minicom`;
//! * `socket=PATH` — a Unix socket (mode 0600) that accepts one client at a
//!   time: the client gets the output and its bytes are the input;
//! * `null`, `file=PATH` — output only.
//!
//! Input goes into the 16550's receive FIFO (64 bytes, `vm-superio`), which
//! raises its receive interrupt; the `serial-in` helper thread reads only
//! as many bytes as the FIFO has room for and waits for the guest to empty
//! it (`SerialEvents::in_buffer_empty`), so nothing typed is lost and a fast
//! sender cannot make the VMM buffer without bound. Output never blocks a
//! vCPU: a full pty or a slow socket client loses bytes, and stdout is
//! written by the `serial-out` helper from a bounded buffer
//! ([`super::serial_out`]); lost bytes are counted ([`DROPPED`]).

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::EventFd;

use crate::config::SerialConfig;

/// Bytes of output lost to a full pty or a slow socket client.
pub static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Where the console's input comes from.
pub enum Input {
    /// Nothing (output-only consoles, stdin not a terminal).
    None,
    /// A descriptor to read (stdin, or the pty's master).
    Fd(OwnedFd),
    /// The listening socket of `socket=PATH`, and the client slot its
    /// output writer shares.
    Socket(UnixListener, Client),
}

/// The socket console's current client (a non-blocking stream), shared by
/// the output writer and the input thread.
pub type Client = Arc<Mutex<Option<OwnedFd>>>;

/// An opened console: the UART's output writer, its input, and what the
/// operator is told at start.
pub struct Console {
    /// The UART's output.
    pub out: Box<dyn Write + Send>,
    /// For stdout (`tty`): the `serial-out` helper's side of the buffered
    /// output and the end of the run's flush ([`super::serial_out`]).
    pub drain: Option<(super::serial_out::Drain, super::serial_out::Flusher)>,
    /// Its input.
    pub input: Input,
    /// A line for stderr at start (the pty's path, the socket's), if any.
    pub announce: Option<String>,
    /// Restores stdin's terminal settings when dropped (`tty` on a terminal).
    pub restore: Option<TermiosGuard>,
}

/// Opens `config`'s console. Errors (each naming the path): the output file
/// or the socket cannot be made, or no pty could be allocated.
pub fn open(config: &SerialConfig) -> io::Result<Console> {
    let plain = |out: Box<dyn Write + Send>| Console {
        out,
        drain: None,
        input: Input::None,
        announce: None,
        restore: None,
    };
    // stdout through the `serial-out` helper: a stalled reader never
    // blocks a vCPU.
    // (A closed stdout, as a daemon may have, discards the output.)
    let stdout = || -> io::Result<_> {
        let Ok(fd) = io::stdout().as_fd().try_clone_to_owned() else {
            return Ok((Box::new(io::sink()) as Box<dyn Write + Send>, None));
        };
        let (out, drain, flusher) = super::serial_out::buffered(fd)?;
        Ok((
            Box::new(out) as Box<dyn Write + Send>,
            Some((drain, flusher)),
        ))
    };
    Ok(match config {
        SerialConfig::Null => plain(Box::new(io::sink())),
        SerialConfig::File(path) => plain(Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| named(path, "serial file", &e))?,
        )),
        SerialConfig::Tty => {
            // SAFETY: isatty(3) on a descriptor number.
            if unsafe { libc::isatty(libc::STDIN_FILENO) } != 1 {
                let (out, drain) = stdout()?;
                return Ok(Console {
                    drain,
                    ..plain(out)
                });
            }
            let restore = TermiosGuard::raw_input(libc::STDIN_FILENO)?;
            // SAFETY: dup(2) of stdin; the copy is owned here.
            let fd = unsafe { libc::dup(libc::STDIN_FILENO) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let (out, drain) = stdout()?;
            Console {
                out,
                drain,
                // SAFETY: `fd` was just duplicated and is owned by nothing else.
                input: Input::Fd(unsafe { OwnedFd::from_raw_fd(fd) }),
                announce: None,
                restore: Some(restore),
            }
        }
        SerialConfig::Pty => {
            let (master, path) = open_pty()?;
            let out = NonBlocking(master.try_clone()?);
            Console {
                out: Box::new(out),
                drain: None,
                input: Input::Fd(master),
                announce: Some(format!("serial on pty {}", path.display())),
                restore: None,
            }
        }
        SerialConfig::Socket(path) => {
            let listener = bind_socket(path)?;
            let client: Client = Arc::default();
            Console {
                out: Box::new(ClientWriter(client.clone())),
                drain: None,
                input: Input::Socket(listener, client),
                announce: Some(format!("serial on socket {}", path.display())),
                restore: None,
            }
        }
    })
}

fn named(path: &Path, what: &str, e: &io::Error) -> io::Error {
    let why = stagevm_api::paths::describe_path_error(path, e);
    io::Error::new(e.kind(), format!("{what} {}: {why}", path.display()))
}

/// A new pseudo-terminal: its master (non-blocking) and the slave's path,
/// the slave in raw mode. The VMM keeps one slave descriptor open for its
/// whole life (closed at exit), so the master never reads as hung up
/// between two clients.
fn open_pty() -> io::Result<(OwnedFd, PathBuf)> {
    // SAFETY: posix_openpt(3); the result is checked.
    let fd = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::other(format!(
            "--serial pty: no pseudo-terminal: {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: `fd` was just opened and is owned here.
    let master = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut name = [0u8; 128];
    // SAFETY: grantpt/unlockpt on our master; ptsname_r writes at most
    // `name.len()` bytes, NUL-terminated.
    let ok = unsafe {
        libc::grantpt(fd) == 0
            && libc::unlockpt(fd) == 0
            && libc::ptsname_r(fd, name.as_mut_ptr().cast(), name.len()) == 0
    };
    if !ok {
        return Err(io::Error::other(format!(
            "--serial pty: {}",
            io::Error::last_os_error()
        )));
    }
    let len = name.iter().position(|&b| b == 0).unwrap_or(0);
    let path = PathBuf::from(String::from_utf8_lossy(&name[..len]).into_owned());
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&path)?;
    // The slave in raw mode: bytes pass unchanged both ways (a terminal
    // program on it sets what it wants).
    TermiosGuard::raw(slave.as_raw_fd())?.keep();
    // Kept open for the process's life: without any slave descriptor a
    // read of the master fails with EIO at once, which would spin the
    // input thread until a client opens the pty.
    std::mem::forget(slave);
    Ok((master, path))
}

/// Binds `path` as the console socket with mode 0600 from the start (a
/// stale socket of an ended VMM is replaced; anything else there is
/// refused).
fn bind_socket(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::other(format!(
                "--serial socket={}: exists and is not a socket",
                path.display()
            )));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::other(format!(
                "--serial socket={}: in use by a running process",
                path.display()
            )));
        }
        std::fs::remove_file(path).map_err(|e| named(path, "--serial socket", &e))?;
    }
    // Mode 0600 from the bind on (VM construction: one thread).
    let listener = stagevm_api::paths::bind_owner_only(path)
        .map_err(|e| named(path, "--serial socket", &e))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Writes `buf` to the non-blocking `fd` with `write(2)` (the one
/// system call every VMM thread may make: vCPU threads write the console);
/// what does not fit is dropped and counted ([`DROPPED`]). `false` when the
/// descriptor failed otherwise (a client gone).
fn write_or_drop(fd: RawFd, buf: &[u8]) -> bool {
    // SAFETY: write(2) reads `buf.len()` bytes of `buf`.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        DROPPED.fetch_add(buf.len() as u64, Ordering::Relaxed);
        return io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock;
    }
    DROPPED.fetch_add((buf.len() - n as usize) as u64, Ordering::Relaxed);
    true
}

/// A non-blocking descriptor (the pty's master) as a writer that never
/// waits.
struct NonBlocking(OwnedFd);

impl Write for NonBlocking {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        write_or_drop(self.0.as_raw_fd(), buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The socket console's output: to the client if one is connected (bytes
/// it does not take at once are dropped and counted), else discarded.
struct ClientWriter(Client);

impl Write for ClientWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = slot.as_ref() {
            if !write_or_drop(client.as_raw_fd(), buf) {
                *slot = None;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Terminal settings to restore when dropped.
pub struct TermiosGuard {
    fd: RawFd,
    saved: Option<libc::termios>,
}

impl TermiosGuard {
    fn get(fd: RawFd) -> io::Result<libc::termios> {
        // SAFETY: an all-zero termios is valid; tcgetattr fills it.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr(3) writes one termios.
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(t)
    }

    fn set(fd: RawFd, t: &libc::termios) -> io::Result<()> {
        // SAFETY: tcsetattr(3) reads one termios.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `fd` in raw mode (`cfmakeraw`).
    fn raw(fd: RawFd) -> io::Result<Self> {
        let saved = Self::get(fd)?;
        let mut t = saved;
        // SAFETY: cfmakeraw(3) edits the termios in place.
        unsafe { libc::cfmakeraw(&mut t) };
        Self::set(fd, &t)?;
        Ok(Self {
            fd,
            saved: Some(saved),
        })
    }

    /// `fd` (the user's terminal) with input passed on at once and not
    /// echoed (the guest echoes), carriage returns kept; signals (Ctrl-C)
    /// and output processing stay as they were.
    fn raw_input(fd: RawFd) -> io::Result<Self> {
        let saved = Self::get(fd)?;
        let mut t = saved;
        t.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ECHONL);
        t.c_iflag &= !(libc::ICRNL | libc::INLCR | libc::IXON);
        t.c_cc[libc::VMIN] = 1;
        t.c_cc[libc::VTIME] = 0;
        Self::set(fd, &t)?;
        Ok(Self {
            fd,
            saved: Some(saved),
        })
    }

    /// Leaves the settings as they are now.
    fn keep(mut self) {
        self.saved = None;
    }
}

impl Drop for TermiosGuard {
    fn drop(&mut self) {
        if let Some(t) = self.saved.take() {
            let _ = Self::set(self.fd, &t);
        }
    }
}

/// Where the input thread puts bytes: the UART's receive FIFO.
pub trait Sink {
    /// Free bytes in the receive FIFO.
    fn room(&self) -> usize;
    /// Enqueues `bytes` (at most [`Sink::room`]); returns how many went in.
    fn push(&self, bytes: &[u8]) -> usize;
}

/// The `serial-in` thread's loop: moves input into `sink` while the FIFO has
/// room, waits on `room` (written when the guest emptied the FIFO) when it
/// has none, and returns when `exit` is readable. A socket console accepts
/// one client at a time (a second one is closed at once).
///
/// A client that hangs up while the FIFO is full (a guest that never reads
/// its console, a client that sent more than 64 bytes and left) is no
/// longer watched — epoll reports a hang-up even on an empty interest set,
/// so watching it would spin — and its unread bytes go in as the guest
/// makes room; the next client to connect takes its place at once. The
/// thread does work only when input, room, a client or the exit arrives.
/// Errors: the epoll set cannot be made.
pub fn serve_input(
    input: Input,
    sink: &dyn Sink,
    room: &EventFd,
    exit: &EventFd,
) -> io::Result<()> {
    const EXIT: u64 = 0;
    const ROOM: u64 = 1;
    const INPUT: u64 = 2;
    const LISTEN: u64 = 3;
    let mut poller =
        stagevm_api::poll::Poller::new(&[(exit.as_raw_fd(), EXIT), (room.as_raw_fd(), ROOM)])?;
    let (fd, listener, client) = match input {
        Input::None => return Ok(()),
        Input::Fd(fd) => (Some(fd), None, None),
        Input::Socket(l, c) => (None, Some(l), Some(c)),
    };
    let mut source = fd.map(Source::new);
    if let Some(f) = &source {
        poller.add(f.fd.as_raw_fd(), INPUT)?;
    }
    if let Some(l) = &listener {
        poller.add(l.as_raw_fd(), LISTEN)?;
    }
    let set_client = |stream: Option<&OwnedFd>| -> io::Result<()> {
        if let Some(slot) = &client {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) =
                stream.map(OwnedFd::try_clone).transpose()?;
        }
        Ok(())
    };
    let mut buf = [0u8; 64];
    loop {
        let ready = poller.wait_events()?;
        let has = |t: u64| ready.iter().any(|r| r.token == t);
        if has(EXIT) {
            return Ok(());
        }
        let mut fresh = false;
        if let (true, Some(l)) = (has(LISTEN), &listener) {
            while let Some(stream) = accept(l) {
                match &source {
                    // One client at a time: this one is closed.
                    Some(s) if !s.hung_up => continue,
                    // A client that left with input pending gives way.
                    Some(s) => drop_source(&poller, s)?,
                    None => {}
                }
                poller.add(stream.as_raw_fd(), INPUT)?;
                set_client(Some(&stream))?;
                source = Some(Source::new(stream));
                fresh = true;
            }
        }
        if has(ROOM) {
            let _ = room.read();
        }
        let Some(s) = &mut source else {
            continue;
        };
        // (An INPUT event of this pass was the replaced client's.)
        let input_ready = ready.iter().find(|r| r.token == INPUT && !fresh);
        if input_ready.is_some_and(|r| r.hung_up) && !s.hung_up && sink.room() == 0 {
            // It hung up and the FIFO is full: stop watching it.
            poller.remove(s.fd.as_raw_fd())?;
            s.hung_up = true;
            continue;
        }
        if !s.hung_up {
            let free = sink.room() > 0;
            if free != s.watched {
                poller.watch(s.fd.as_raw_fd(), INPUT, free)?;
                s.watched = free;
            }
            if !free || input_ready.is_none() {
                continue;
            }
        }
        // Read what fits; a hung-up source until it is empty or the FIFO
        // full (nothing will wake the thread for it but room).
        let ended = loop {
            let free = sink.room().min(buf.len());
            if free == 0 {
                break false;
            }
            // SAFETY: read(2) writes at most `free` bytes into `buf`.
            let n = unsafe { libc::read(s.fd.as_raw_fd(), buf.as_mut_ptr().cast(), free) };
            if n > 0 {
                sink.push(&buf[..n as usize]);
                if s.hung_up {
                    continue;
                }
                break false;
            }
            let again = n < 0
                && matches!(
                    io::Error::last_os_error().kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                );
            // End of input (stdin closed, the client left) or an error.
            break !again || s.hung_up;
        };
        if ended {
            // A socket console waits for the next client.
            drop_source(&poller, s)?;
            source = None;
            set_client(None)?;
        }
    }
}

/// The descriptor input is read from, and how it is watched.
struct Source {
    fd: OwnedFd,
    /// Watched for input (else for nothing: the FIFO is full).
    watched: bool,
    /// It hung up while the FIFO was full: out of the epoll set, read as
    /// room comes.
    hung_up: bool,
}

impl Source {
    fn new(fd: OwnedFd) -> Self {
        Self {
            fd,
            watched: true,
            hung_up: false,
        }
    }
}

/// Takes `s` out of the epoll set (unless it already is).
fn drop_source(poller: &stagevm_api::poll::Poller, s: &Source) -> io::Result<()> {
    if !s.hung_up {
        poller.remove(s.fd.as_raw_fd())?;
    }
    Ok(())
}

/// The next pending connection of the console socket, non-blocking
/// (`accept4` with the flags at once: no later `fcntl`), if any.
fn accept(l: &UnixListener) -> Option<OwnedFd> {
    // SAFETY: accept4(2) without an address buffer.
    let c = unsafe {
        libc::accept4(
            l.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    // SAFETY: `c` was just accepted and is owned here.
    (c >= 0).then(|| unsafe { OwnedFd::from_raw_fd(c) })
}
