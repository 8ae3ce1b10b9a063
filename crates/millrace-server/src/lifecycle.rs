//! The server process's life: which signals it takes, what it says when it stops, and how it
//! tells a supervisor (systemd) that it is ready. A server outlives its peers: a peer that hangs
//! up must fail its own connection, never raise a signal that ends the process; and whatever
//! ends the process (a requested stop, a panic, a fatal signal) is written to the log first.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Why an orderly stop began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopCause {
    /// SIGTERM or SIGINT: a stop someone asked for (systemd, Ctrl-C).
    Requested(i32),
    /// Another signal whose default would have ended the process (SIGHUP, SIGUSR1, ...):
    /// served as an orderly stop, but reported as a failure so a supervisor restarts.
    Signal(i32),
}

impl StopCause {
    /// The process's exit status for this stop: 0 for a requested stop, 128 + the signal's
    /// number otherwise (what a shell reports for a process the signal ended).
    pub fn exit_code(self) -> i32 {
        match self {
            StopCause::Requested(_) => 0,
            StopCause::Signal(n) => 128 + n,
        }
    }
}

impl std::fmt::Display for StopCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            StopCause::Requested(n) => write!(f, "{} received (a requested stop)", name(n)),
            StopCause::Signal(n) => write!(
                f,
                "{} received (a signal that would end the process; stopping in order)",
                name(n)
            ),
        }
    }
}

/// Signals that ask the process to end: each is turned into an orderly stop.
const STOP_SIGNALS: &[i32] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGIO,
    libc::SIGPWR,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGSTKFLT,
];

/// Signals after which the process cannot go on (its memory or code may be wrong): each is
/// logged, then ends the process as it would have (status 128 + N, a core where enabled).
const CRASH_SIGNALS: &[i32] = &[
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
    libc::SIGTRAP,
    libc::SIGSYS,
    libc::SIGQUIT,
];

/// The signal's name, as `kill -l` spells it.
pub fn name(n: i32) -> &'static str {
    match n {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTKFLT => "SIGSTKFLT",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSYS => "SIGSYS",
        _ => "a signal",
    }
}

/// Messages the crash handler writes, made before any signal can arrive: a signal handler may
/// not allocate or format, only write(2) bytes that already exist.
static CRASH_LINES: std::sync::OnceLock<Vec<(i32, Vec<u8>)>> = std::sync::OnceLock::new();

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Sets up the process for serving: SIGPIPE ignored (a write to a peer that hung up fails
/// that write with EPIPE instead of ending the process), panics logged, fatal signals logged
/// before they end the process. Idempotent: tests start several servers in one process.
pub fn prepare_process() {
    // SAFETY: SIG_IGN for SIGPIPE is async-signal-safe and changes only the disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return;
    }
    install_panic_log();
    install_crash_handlers();
}

fn install_panic_log() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("unnamed");
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_else(|| "an unknown place".into());
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        tracing::error!(thread, at, "panic: {what}");
        // The log may go nowhere (no subscriber): the line on stderr is what a supervisor keeps.
        let _ = writeln!(
            std::io::stderr(),
            "millrace serve: panic in thread '{thread}' at {at}: {what}"
        );
        previous(info);
    }));
}

/// The handlers that were there before ours (Rust's stack-overflow report, the mapped members'
/// SIGBUS recovery), by signal: a fault is theirs to handle first.
static PREVIOUS: std::sync::OnceLock<Vec<(i32, libc::sigaction)>> = std::sync::OnceLock::new();

fn install_crash_handlers() {
    let lines = CRASH_SIGNALS
        .iter()
        .map(|&n| {
            let line = format!(
                "millrace serve: stopping on {} (a fatal signal: {}); the pools are resynced at the next start\n",
                name(n),
                match n {
                    libc::SIGQUIT | libc::SIGABRT => "asked to quit with a core dump",
                    _ => "a fault in the server, please report it with this log",
                }
            );
            (n, line.into_bytes())
        })
        .collect();
    let _ = CRASH_LINES.set(lines);
    let mut previous = Vec::new();
    for &n in CRASH_SIGNALS {
        // SAFETY: a zeroed sigaction is valid; the handler only calls async-signal-safe
        // functions (write, sigaction, signal, raise, the previous handler) on data made
        // before it was installed.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_crash as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(n, &sa, &mut old) == 0 {
                previous.push((n, old));
            }
        }
    }
    let _ = PREVIOUS.set(previous);
}

fn write_line(sig: i32) {
    if let Some((_, line)) = CRASH_LINES
        .get()
        .and_then(|l| l.iter().find(|(n, _)| *n == sig))
    {
        // SAFETY: write(2) of bytes that live for the whole process.
        unsafe {
            libc::write(2, line.as_ptr().cast(), line.len());
        }
    }
}

/// Whether `sig`'s disposition is back to its default (a previous handler gave up on a fault,
/// which, happening again, ends the process).
fn back_to_default(sig: i32) -> bool {
    // SAFETY: reading a signal's disposition into a zeroed struct.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut cur) == 0 && cur.sa_sigaction == libc::SIG_DFL
    }
}

extern "C" fn on_crash(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler. A code above zero
    // is the kernel's (a fault); zero and below, a process sent it (kill, tgkill, sigqueue).
    let fault = !info.is_null() && unsafe { (*info).si_code } > 0;
    let prev = PREVIOUS
        .get()
        .and_then(|p| p.iter().find(|(n, _)| *n == sig))
        .map(|(_, a)| *a)
        .filter(|a| a.sa_sigaction != libc::SIG_DFL && a.sa_sigaction != libc::SIG_IGN);
    if let (true, Some(prev)) = (fault, prev) {
        // The handler before ours handles a fault first (it may recover, as the mapped
        // members' SIGBUS handler does); the line is written only if it gave up.
        // SAFETY: calling the handler that was installed for this signal, as the kernel would
        // have, with the arguments its flags ask for.
        unsafe {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(prev.sa_sigaction);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(i32) = std::mem::transmute(prev.sa_sigaction);
                f(sig);
            }
        }
        if back_to_default(sig) {
            write_line(sig);
        }
        return;
    }
    write_line(sig);
    // SAFETY: back to the default action, then the signal again: a sent signal is pending and
    // ends the process when this handler returns; a fault happens again and ends it.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// The signals that ask the process to end, taken from the moment `install` is called (their
/// default action, ending the process at once, no longer applies).
pub struct StopSignals(Vec<(i32, tokio::signal::unix::Signal)>);

impl StopSignals {
    /// Takes every stop signal; must run inside the runtime.
    pub fn install() -> StopSignals {
        use tokio::signal::unix::{signal, SignalKind};
        let taken = STOP_SIGNALS
            .iter()
            .filter_map(|&n| signal(SignalKind::from_raw(n)).ok().map(|s| (n, s)))
            .collect();
        StopSignals(taken)
    }

    /// Resolves with the cause once one of the signals arrives.
    pub async fn wait(self) -> StopCause {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let watchers: Vec<_> = (self.0.into_iter())
            .map(|(n, mut s)| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    if s.recv().await.is_some() {
                        let _ = tx.send(n);
                    }
                })
            })
            .collect();
        drop(tx);
        let n = match rx.recv().await {
            Some(n) => n,
            // No signal could be taken at all: serve until the process is killed.
            None => std::future::pending().await,
        };
        for w in watchers {
            w.abort();
        }
        match n {
            libc::SIGTERM | libc::SIGINT => StopCause::Requested(n),
            _ => StopCause::Signal(n),
        }
    }
}

/// Tells systemd (Type=notify) that every port answers. Nothing happens when no supervisor
/// listens (NOTIFY_SOCKET unset).
pub fn notify_ready() {
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
}

/// Tells systemd that a stop has begun (the drain may take a while).
pub fn notify_stopping() {
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
}
