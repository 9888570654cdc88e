//! Process plumbing shared by the two long-running commands, `serve` and `controller`: logging,
//! the tokio runtime, signals (drain on the first, exit at the second) and the plain-HTTP admin
//! router (`/healthz`, `/readyz`, `/metrics`). Each component only says what "live", "ready"
//! and "metrics" mean for it ([`AdminProbes`]).

use std::future::Future;
use std::io::IsTerminal as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tracing_subscriber::EnvFilter;

use gpu_guard_core::wellknown::{HEALTHZ_PATH, METRICS_PATH, READYZ_PATH};

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One JSON object a line (for log collectors).
    Json,
    /// Human-readable lines.
    Text,
}

/// Bytes of log lines held for the writer thread before new lines are dropped: about 3,700
/// text lines (a second of requests at 2,000 a second, with room to spare) when stderr stalls.
const LOG_QUEUE_BYTES: usize = 1 << 20;

/// Queued bytes at which the writer is woken before its window ends, so that under load a
/// batch stays near this size (the buffers' share of peak memory) rather than filling the queue.
const LOG_BATCH_BYTES: usize = 64 << 10;

/// How long the writer thread gathers lines after the first one before writing them out. One
/// wake-up and one write a batch instead of one a line: at 200 requests a second, a wake-up of
/// the writer per request was a context switch per request more than a server without logs.
const LOG_BATCH_WINDOW: std::time::Duration = std::time::Duration::from_millis(100);

/// Lines waiting for the writer thread, shared with every [`LogQueueWriter`].
#[derive(Debug, Default)]
struct LogQueue {
    lines: std::sync::Mutex<Vec<u8>>,
    dropped: std::sync::atomic::AtomicU64,
    closing: std::sync::atomic::AtomicBool,
}

impl LogQueue {
    fn lines(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        // A panic while holding the lock cannot leave half a line: lines are appended whole.
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The queue of the installed log writer, for [`dropped_log_lines`].
static LOG_QUEUE: std::sync::OnceLock<Arc<LogQueue>> = std::sync::OnceLock::new();

/// Log lines dropped because stderr could not take them as fast as they came (a stalled log
/// collector, a full pipe): the cost of never letting a request wait on a log line.
pub fn dropped_log_lines() -> u64 {
    LOG_QUEUE.get().map_or(0, |queue| {
        queue.dropped.load(std::sync::atomic::Ordering::Relaxed)
    })
}

/// What tracing's formatter writes each event to: one `write` a whole line (the formatter
/// formats into its own buffer first), appended to the queue or, when the queue is full,
/// dropped and counted. Never blocks on stderr.
#[derive(Clone, Debug)]
struct LogQueueWriter {
    queue: Arc<LogQueue>,
    writer: std::thread::Thread,
}

impl std::io::Write for LogQueueWriter {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut lines = self.queue.lines();
        if lines.len() + line.len() > LOG_QUEUE_BYTES {
            drop(lines);
            self.queue
                .dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(line.len());
        }
        let first = lines.is_empty();
        lines.extend_from_slice(line);
        let full_batch = lines.len() >= LOG_BATCH_BYTES;
        drop(lines);
        // Wake the writer for the first line of a batch (it then waits out its window) or
        // when a batch is full; otherwise it is awake already. Unparking a thread that is
        // not parked is one atomic swap, no system call.
        if first || full_batch {
            self.writer.unpark();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogQueueWriter {
    type Writer = LogQueueWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// The writer thread: waits for a first line, gathers for [`LOG_BATCH_WINDOW`] (less when a
/// batch fills), writes the batch to `out` in one call, and at close writes what is left.
/// (`Stderr::write_all` takes its lock once a batch: other writers' lines never land inside one
/// of ours.)
fn write_log_batches(queue: &LogQueue, out: &mut dyn std::io::Write) {
    use std::sync::atomic::Ordering;
    // Two buffers swapped under the lock: appending never waits for a write in progress.
    let mut batch = Vec::new();
    loop {
        let closing = loop {
            let closing = queue.closing.load(Ordering::Acquire);
            if closing || !queue.lines().is_empty() {
                break closing;
            }
            std::thread::park();
        };
        if !closing {
            std::thread::park_timeout(LOG_BATCH_WINDOW);
        }
        std::mem::swap(&mut *queue.lines(), &mut batch);
        if !batch.is_empty() && out.write_all(&batch).is_err() {
            // Nowhere to say so but the metric: stderr is closed or failing.
            let lines = batch.iter().filter(|&&byte| byte == b'\n').count();
            queue.dropped.fetch_add(lines as u64, Ordering::Relaxed);
        }
        batch.clear();
        // A burst's buffer is given back; the usual batch keeps its capacity.
        batch.shrink_to(LOG_BATCH_BYTES);
        if closing && queue.lines().is_empty() {
            return;
        }
    }
}

/// The log writer thread and its queue; dropping it writes out what is queued and stops it.
struct LogWriterThread {
    queue: Arc<LogQueue>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LogWriterThread {
    /// Starts the thread writing to `out`; `None` if it cannot be started.
    fn start(mut out: impl std::io::Write + Send + 'static) -> Option<(Self, LogQueueWriter)> {
        let queue = Arc::new(LogQueue::default());
        let thread = std::thread::Builder::new()
            .name("gpu-guard-log".to_owned())
            .spawn({
                let queue = queue.clone();
                move || write_log_batches(&queue, &mut out)
            })
            .ok()?;
        let writer = LogQueueWriter {
            queue: queue.clone(),
            writer: thread.thread().clone(),
        };
        Some((
            Self {
                queue,
                thread: Some(thread),
            },
            writer,
        ))
    }
}

impl Drop for LogWriterThread {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.queue
                .closing
                .store(true, std::sync::atomic::Ordering::Release);
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// Keeps the log writer's thread: dropping it writes out what is still queued.
#[must_use = "the log writer stops when this is dropped"]
pub struct LogGuard {
    _writer: Option<LogWriterThread>,
}

/// Logs to stderr, as text or one JSON object a line, filtered by `level` (a level or a
/// tracing filter; `info` when it does not parse). Text is coloured only on a terminal
/// ([`log_colours`]): a log file or a collector gets no escape codes.
///
/// Lines are written by a thread of their own, in batches (up to [`LOG_BATCH_WINDOW`] late),
/// from a bounded queue that drops lines when full ([`dropped_log_lines`]): a request thread
/// never blocks on stderr. Blocking writes stalled the webhook outright once a reader stopped
/// draining its stderr pipe (64 KB, about 140 requests), and cost a write system call on the
/// request path each time.
pub fn init_logging(format: LogFormat, level: &str, colour: LogColour) -> LogGuard {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let colours = match colour {
        LogColour::Always => true,
        LogColour::Never => false,
        LogColour::Auto => log_colours(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        ),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colours);
    // Without a thread (none can be started), lines are written on the caller's thread.
    let Some((thread, writer)) = LogWriterThread::start(std::io::stderr()) else {
        let builder = builder.with_writer(std::io::stderr);
        let _ = match format {
            LogFormat::Json => builder.json().flatten_event(true).try_init(),
            LogFormat::Text => builder.try_init(),
        };
        return LogGuard { _writer: None };
    };
    let queue = writer.queue.clone();
    let builder = builder.with_writer(writer);
    let installed = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
    // A second initialisation (tests run several servers in one process) keeps the first,
    // and this thread stops.
    match installed {
        Ok(()) => {
            let _ = LOG_QUEUE.set(queue);
            LogGuard {
                _writer: Some(thread),
            }
        }
        Err(_) => LogGuard { _writer: None },
    }
}

/// Whether text logs carry colour codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogColour {
    /// When stderr is a terminal and `NO_COLOR` is unset or empty.
    Auto,
    Always,
    Never,
}

/// Whether text logs carry ANSI colours: only when stderr is a terminal, and not when
/// `NO_COLOR` is set to anything but the empty string (<https://no-color.org>, as
/// tracing-subscriber reads it).
pub fn log_colours(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

/// Why a long-running command could not set up its process: the runtime or the signal
/// handlers.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot start the async runtime: {source}")]
    Runtime {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot catch {signal}: {source}")]
    Signal {
        /// `SIGTERM` or `SIGINT`.
        signal: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The multi-threaded tokio runtime of a command: one worker a core, or `workers`.
pub fn runtime(workers: Option<usize>) -> Result<tokio::runtime::Runtime, ProcessError> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = workers {
        builder.worker_threads(workers);
    }
    builder
        .enable_all()
        .build()
        .map_err(|source| ProcessError::Runtime { source })
}

/// SIGTERM and SIGINT, caught from the moment [`Signals::install`] returns.
///
/// Install before the component starts: a signal that arrives before the handlers exist takes
/// the default action and kills the process without a drain (a pod deleted while starting).
pub struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers; call inside the runtime.
    pub fn install() -> Result<Self, ProcessError> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let install = |kind: SignalKind, name: &'static str| {
                signal(kind).map_err(|source| ProcessError::Signal {
                    signal: name,
                    source,
                })
            };
            Ok(Self {
                terminate: install(SignalKind::terminate(), "SIGTERM")?,
                interrupt: install(SignalKind::interrupt(), "SIGINT")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Returns at the next SIGTERM or SIGINT (one delivered since the last call counts).
    pub async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// How a long-running command ended after its first signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The shutdown ran to its end (exit 0).
    Cleanly,
    /// A second signal came first (exit 130, at once).
    AtSecondSignal,
}

impl Stopped {
    /// The process exit code.
    pub fn exit_code(self) -> i32 {
        match self {
            Stopped::Cleanly => 0,
            Stopped::AtSecondSignal => 130,
        }
    }
}

/// Runs `shutdown` to its end, unless a second signal comes first.
pub async fn shut_down_or_exit_at_second_signal(
    signals: &mut Signals,
    shutdown: impl Future<Output = ()>,
) -> Stopped {
    tokio::select! {
        () = shutdown => Stopped::Cleanly,
        () = signals.next() => {
            tracing::warn!("second signal: exiting at once");
            Stopped::AtSecondSignal
        }
    }
}

/// Turns Nagle's algorithm off on an accepted connection (`TCP_NODELAY`).
///
/// With it on, a write made while an earlier small one is unacknowledged waits for that ACK,
/// and the client delays its ACKs by up to 40 ms: the first response on every TLS connection
/// (written just after the session tickets) took 40 ms more. A server that writes whole
/// responses has nothing to gain from Nagle.
pub fn set_nodelay(stream: &tokio::net::TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY on an accepted connection");
    }
}

/// `listener` for `axum::serve`, with [`set_nodelay`] on every connection it accepts.
pub fn without_nagle(
    listener: tokio::net::TcpListener,
) -> axum::serve::TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)> {
    use axum::serve::ListenerExt as _;
    listener.tap_io(|stream| set_nodelay(stream))
}

/// What the admin port reports of a component.
pub trait AdminProbes: Send + Sync + 'static {
    /// `Ok`, or why the process should be restarted (`/healthz` answers 503 with it).
    fn liveness(&self) -> Result<(), &'static str> {
        Ok(())
    }
    /// `Ok`, or why the process should get no traffic yet (`/readyz` answers 503 with it).
    fn readiness(&self) -> Result<(), &'static str>;
    /// The OpenMetrics text of `/metrics`.
    fn metrics(&self) -> String;
}

/// The admin routes: `/healthz` (`ok`), `/readyz` (`ready`) and `/metrics`, each answering
/// from `probes`.
pub fn admin_router<P: AdminProbes>(probes: Arc<P>) -> Router {
    Router::new()
        .route(HEALTHZ_PATH, get(healthz::<P>))
        .route(READYZ_PATH, get(readyz::<P>))
        .route(METRICS_PATH, get(metrics::<P>))
        .with_state(probes)
}

async fn healthz<P: AdminProbes>(State(probes): State<Arc<P>>) -> Response {
    probe_response(probes.liveness(), "ok")
}

async fn readyz<P: AdminProbes>(State(probes): State<Arc<P>>) -> Response {
    probe_response(probes.readiness(), "ready")
}

fn probe_response(result: Result<(), &'static str>, ok: &'static str) -> Response {
    match result {
        Ok(()) => (StatusCode::OK, format!("{ok}\n")).into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

async fn metrics<P: AdminProbes>(State(probes): State<Arc<P>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        probes.metrics(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    struct Starting;

    impl AdminProbes for Starting {
        fn readiness(&self) -> Result<(), &'static str> {
            Err("waiting for the caches to sync")
        }
        fn metrics(&self) -> String {
            "# EOF\n".to_owned()
        }
    }

    async fn get(router: Router, path: &str) -> (StatusCode, String) {
        let response = router
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn the_admin_routes_answer_from_the_probes() {
        let router = admin_router(Arc::new(Starting));
        assert_eq!(
            get(router.clone(), HEALTHZ_PATH).await,
            (StatusCode::OK, "ok\n".to_owned())
        );
        assert_eq!(
            get(router.clone(), READYZ_PATH).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "waiting for the caches to sync\n".to_owned()
            )
        );
        assert_eq!(
            get(router, METRICS_PATH).await,
            (StatusCode::OK, "# EOF\n".to_owned())
        );
    }

    /// A signal delivered after `install` and before anyone waits is not lost (and does not
    /// kill the process): the race of a pod deleted while its server starts.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_signal_before_the_first_wait_is_kept() {
        let mut signals = Signals::install().unwrap();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        tokio::time::timeout(std::time::Duration::from_secs(10), signals.next())
            .await
            .expect("the SIGTERM sent before the wait is delivered");
    }

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(log_colours(true, None));
        assert!(log_colours(true, Some(OsStr::new(""))));
        assert!(!log_colours(true, Some(OsStr::new("1"))));
        // A file, a pipe or a log collector: never escape codes.
        assert!(!log_colours(false, None));
    }

    #[test]
    fn a_second_signal_exits_130() {
        assert_eq!(Stopped::Cleanly.exit_code(), 0);
        assert_eq!(Stopped::AtSecondSignal.exit_code(), 130);
    }

    /// An output the test reads after the writer thread stopped.
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn log_lines_reach_the_output_whole_and_in_order_and_the_rest_at_close() {
        use std::io::Write as _;
        let out = Captured::default();
        let (thread, writer) = LogWriterThread::start(out.clone()).unwrap();
        // From several threads, more than a batch: every line whole, each thread's in order.
        let senders: Vec<_> = (0..4)
            .map(|sender| {
                let mut writer = writer.clone();
                std::thread::spawn(move || {
                    for line in 0..2_000 {
                        let text = format!("sender {sender} line {line:04} {}\n", "x".repeat(40));
                        writer.write_all(text.as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for sender in senders {
            sender.join().unwrap();
        }
        drop(thread);
        let written = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = written.lines().collect();
        assert_eq!(lines.len(), 8_000);
        for sender in 0..4 {
            let own: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|line| line.starts_with(&format!("sender {sender} ")))
                .collect();
            let expected: Vec<String> = (0..2_000)
                .map(|line| format!("sender {sender} line {line:04} {}", "x".repeat(40)))
                .collect();
            assert_eq!(own, expected);
        }
        assert_eq!(
            writer
                .queue
                .dropped
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }

    #[test]
    fn a_full_log_queue_drops_whole_lines_and_counts_them() {
        use std::io::Write as _;
        // No writer thread: nothing drains the queue, as when stderr is stalled.
        let queue = Arc::new(LogQueue::default());
        let mut writer = LogQueueWriter {
            queue: queue.clone(),
            writer: std::thread::current(),
        };
        let line = [b'x'; 1000];
        for _ in 0..2_000 {
            writer.write_all(&line).unwrap();
        }
        let kept = LOG_QUEUE_BYTES / line.len();
        assert_eq!(queue.lines().len(), kept * line.len());
        assert_eq!(
            queue.dropped.load(std::sync::atomic::Ordering::Relaxed),
            (2_000 - kept) as u64
        );
    }

    #[test]
    fn lines_a_failing_output_refused_are_counted_as_dropped() {
        use std::io::Write as _;
        struct Closed;
        impl std::io::Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (thread, mut writer) = LogWriterThread::start(Closed).unwrap();
        for _ in 0..10 {
            writer.write_all(b"a line\n").unwrap();
        }
        drop(thread);
        assert_eq!(
            writer
                .queue
                .dropped
                .load(std::sync::atomic::Ordering::Relaxed),
            10
        );
    }
}
