//! `hystall lab tcp`: writers into loopback targets of the four behaviours, so the
//! socket side of the failure (DESIGN.md §1–2) can be reproduced without a proxy.
//!
//! Non-blocking writers are tokio tasks: a send into a full buffer gets EAGAIN and
//! the task parks until the socket is writable, exactly like a Go proxy's io.Copy
//! on netpoll. Blocking writers are threads that end up parked inside write().
//! Once every writer is connected the lab prints one `lab_ready` JSON line (the
//! pid, targets and 4-tuples a watcher needs), then writes until `--duration`
//! elapses or SIGINT/SIGTERM arrives, and prints `lab_done`.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::signal::unix::{SignalKind, signal};

use super::targets::{self, Target};
use crate::cli::{Behaviour, TcpLabArgs};

/// One writer, as announced in the ready line.
#[derive(Debug, Serialize)]
struct WriterInfo {
    behaviour: Behaviour,
    blocking: bool,
    /// The writer socket's own address: with `remote`, the 4-tuple to look for.
    local: SocketAddr,
    remote: SocketAddr,
}

#[derive(Debug, Serialize)]
struct Ready<'a> {
    event: &'static str,
    pid: u32,
    targets: BTreeMap<&'static str, SocketAddr>,
    writers: &'a [WriterInfo],
}

#[derive(Debug, Serialize)]
struct Done {
    event: &'static str,
    /// "duration" or "signal".
    reason: &'static str,
    /// Bytes each writer got into its socket, in the order of the ready line. A
    /// blocking writer's count moves only when a whole write() returns, so the
    /// chunk it is parked in is not counted.
    written: Vec<u64>,
}

pub fn run(args: TcpLabArgs) -> anyhow::Result<()> {
    let plan = plan(&args);
    if plan.is_empty() {
        bail!("nothing to do: give --stall/--stall-blocking/--fast/--slow/--upclose counts");
    }
    if args.chunk == 0 {
        bail!("--chunk must be at least 1 byte");
    }
    let duration = args
        .duration
        .map(Duration::try_from_secs_f64)
        .transpose()
        .context("--duration must be a finite, non-negative number of seconds")?;
    let delay =
        Duration::try_from_secs_f64(args.delay).context("--delay must be a finite, non-negative number of seconds")?;
    let connect_after = Duration::try_from_secs_f64(args.connect_after)
        .context("--connect-after must be a finite, non-negative number of seconds")?;
    if tokio::runtime::Handle::try_current().is_ok() {
        bail!("the TCP lab starts its own runtime: call it outside an async context");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")?;
    let waits = Waits { connect_after, delay };
    let result = rt.block_on(lab(&plan, args.chunk, duration, waits, args.ready_file.as_deref(), &mut io::stdout()));
    // Don't wait for anything: blocking writers are detached std threads parked in
    // write(), and they neither hold the runtime nor keep the process alive.
    rt.shutdown_background();
    result
}

/// Which writers to start, in the order they are announced: (behaviour, blocking).
fn plan(args: &TcpLabArgs) -> Vec<(Behaviour, bool)> {
    let groups = [
        (Behaviour::Stall, false, args.stall),
        (Behaviour::Stall, true, args.stall_blocking),
        (Behaviour::Fast, false, args.fast),
        (Behaviour::Slow, false, args.slow),
        (Behaviour::Upclose, false, args.upclose),
    ];
    groups.into_iter().flat_map(|(b, blocking, n)| std::iter::repeat_n((b, blocking), n)).collect()
}

/// How long the lab waits before connecting, and after the ready line before writing.
#[derive(Clone, Copy, Default)]
struct Waits {
    connect_after: Duration,
    delay: Duration,
}

async fn lab(
    plan: &[(Behaviour, bool)],
    chunk: usize,
    duration: Option<Duration>,
    waits: Waits,
    ready_file: Option<&Path>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    // Install signal handlers before announcing readiness, so a SIGTERM sent right
    // after the ready line is not lost (or fatal).
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;

    // One target per behaviour in use; held until the lab ends (a stall target's
    // sockets must stay open that long).
    let mut targets: BTreeMap<&'static str, Target> = BTreeMap::new();
    for &(behaviour, _) in plan {
        let name = targets::behaviour_name(behaviour);
        if !targets.contains_key(name) {
            let target =
                targets::spawn_target(behaviour).await.with_context(|| format!("starting the {name} target"))?;
            targets.insert(name, target);
        }
    }

    if !waits.connect_after.is_zero() {
        tokio::time::sleep(waits.connect_after).await;
    }
    // Connect everything before announcing, so the ready line lists every socket.
    let mut infos = Vec::with_capacity(plan.len());
    let mut streams = Vec::with_capacity(plan.len());
    for &(behaviour, blocking) in plan {
        let name = targets::behaviour_name(behaviour);
        let remote = targets[name].addr();
        let stream = TcpStream::connect(remote)
            .await
            .with_context(|| format!("connecting a writer to the {name} target at {remote}"))?;
        let local = stream.local_addr().context("reading a writer's local address")?;
        infos.push(WriterInfo { behaviour, blocking, local, remote });
        // Blocking writers are blocking sockets from the start, as in a
        // thread-per-connection server: a watcher sees them so at once.
        streams.push(if blocking {
            let stream = stream.into_std().context("taking a writer socket out of tokio")?;
            stream.set_nonblocking(false).context("making a writer socket blocking")?;
            Writer::Blocking(stream)
        } else {
            Writer::NonBlocking(stream)
        });
    }

    let ready = Ready {
        event: "lab_ready",
        pid: std::process::id(),
        targets: targets.iter().map(|(name, t)| (*name, t.addr())).collect(),
        writers: &infos,
    };
    let line = serde_json::to_string(&ready).context("encoding the ready line")?;
    // The file first: if it cannot be written, fail before announcing anything.
    if let Some(path) = ready_file {
        write_ready_file(path, &line)?;
    }
    writeln!(out, "{line}").and_then(|()| out.flush()).context("printing the ready line")?;
    if !waits.delay.is_zero() {
        tokio::time::sleep(waits.delay).await;
    }

    let chunk: Arc<[u8]> = vec![0u8; chunk].into();
    let mut counters = Vec::with_capacity(streams.len());
    for stream in streams {
        let written = Arc::new(AtomicU64::new(0));
        counters.push(written.clone());
        match stream {
            Writer::Blocking(stream) => {
                let chunk = chunk.clone();
                // Detached: the thread may stay parked in write() until the process exits.
                std::thread::Builder::new()
                    .name("lab-writer".into())
                    .spawn(move || log_end("blocking", write_blocking(stream, &chunk, &written)))
                    .context("starting a blocking writer thread")?;
            }
            Writer::NonBlocking(stream) => {
                tokio::spawn(write_nonblocking(stream, chunk.clone(), written));
            }
        }
    }

    let reason = tokio::select! {
        () = sleep_for(duration) => "duration",
        _ = sigint.recv() => "signal",
        _ = sigterm.recv() => "signal",
    };
    let done =
        Done { event: "lab_done", reason, written: counters.iter().map(|c| c.load(Ordering::Relaxed)).collect() };
    let line = serde_json::to_string(&done).context("encoding the done line")?;
    // Best effort: after Ctrl-C in a pipeline the reader may be gone already, and
    // the lab has done its job either way.
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    drop(targets);
    Ok(())
}

/// Writes the ready line to `path` atomically (temp file, then rename), so a
/// script polling for the file never reads half a line.
fn write_ready_file(path: &Path, line: &str) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, format!("{line}\n"))
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("writing the ready file {}", path.display()))
}

async fn sleep_for(duration: Option<Duration>) {
    match duration {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// `write_all(chunk)` forever, counting what each send takes. An error (EPIPE or
/// ECONNRESET once an upclose target has gone) ends it and drops the socket, like
/// a proxy's io.Copy returning.
/// A connected writer socket, in the mode its writer will use.
enum Writer {
    NonBlocking(TcpStream),
    Blocking(std::net::TcpStream),
}

async fn write_nonblocking(mut stream: TcpStream, chunk: Arc<[u8]>, written: Arc<AtomicU64>) {
    let mut off = 0;
    let result = loop {
        match stream.write(&chunk[off..]).await {
            Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => off = advance(off, n, chunk.len(), &written),
            Err(e) => break Err(e),
        }
    };
    log_end("non-blocking", result);
}

/// The blocking twin of [`write_nonblocking`]: parks inside write() when full.
fn write_blocking(mut stream: std::net::TcpStream, chunk: &[u8], written: &AtomicU64) -> io::Result<()> {
    let mut off = 0;
    loop {
        match stream.write(&chunk[off..])? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => off = advance(off, n, chunk.len(), written),
        }
    }
}

/// Counts `n` bytes sent and returns where the rest of the chunk starts (0 once
/// the whole chunk is out, which starts the next one).
fn advance(off: usize, n: usize, len: usize, written: &AtomicU64) -> usize {
    written.fetch_add(n as u64, Ordering::Relaxed);
    (off + n) % len
}

fn log_end(kind: &str, result: io::Result<()>) {
    if let Err(e) = result {
        tracing::debug!("lab {kind} writer stopped: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> TcpLabArgs {
        TcpLabArgs {
            stall: 0,
            stall_blocking: 0,
            fast: 0,
            slow: 0,
            upclose: 0,
            duration: None,
            delay: 0.0,
            connect_after: 0.0,
            chunk: 32 * 1024,
            ready_file: None,
        }
    }

    #[test]
    fn zero_writers_is_a_clear_error() {
        let err = run(args()).unwrap_err();
        assert!(err.to_string().starts_with("nothing to do"), "{err}");
    }

    #[test]
    fn ready_line_format() {
        let a: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let writers = [WriterInfo { behaviour: Behaviour::Upclose, blocking: true, local: b, remote: a }];
        let ready = Ready { event: "lab_ready", pid: 42, targets: [("upclose", a)].into(), writers: &writers };
        assert_eq!(
            serde_json::to_string(&ready).unwrap(),
            r#"{"event":"lab_ready","pid":42,"targets":{"upclose":"127.0.0.1:4000"},"writers":[{"behaviour":"upclose","blocking":true,"local":"127.0.0.1:5000","remote":"127.0.0.1:4000"}]}"#
        );
    }

    #[test]
    fn plan_keeps_the_announced_order() {
        let a = TcpLabArgs { stall: 1, stall_blocking: 1, fast: 1, slow: 1, upclose: 2, ..args() };
        use Behaviour::*;
        let want = [(Stall, false), (Stall, true), (Fast, false), (Slow, false), (Upclose, false), (Upclose, false)];
        assert_eq!(plan(&a), want);
    }

    #[test]
    fn a_short_run_announces_every_writer_and_counts_bytes() {
        let plan = plan(&TcpLabArgs { stall: 2, stall_blocking: 1, fast: 1, slow: 1, upclose: 1, ..args() });
        let dir = std::env::temp_dir().join(format!("hystall-lab-tcp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ready_file = dir.join("ready");
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut out = Vec::new();
        rt.block_on(lab(
            &plan,
            32 * 1024,
            Some(Duration::from_millis(1500)),
            Waits::default(),
            Some(&ready_file),
            &mut out,
        ))
        .unwrap();
        rt.shutdown_background();

        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2, "{text}");
        let (ready, done) = (&lines[0], &lines[1]);
        assert_eq!(ready["event"], "lab_ready");
        assert_eq!(ready["pid"], std::process::id());
        let file = std::fs::read_to_string(&ready_file).unwrap();
        assert_eq!(file.trim_end(), text.lines().next().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();

        let targets = ready["targets"].as_object().unwrap();
        assert_eq!(targets.len(), 4);
        let writers = ready["writers"].as_array().unwrap();
        assert_eq!(writers.len(), 6);
        for w in writers {
            let b = w["behaviour"].as_str().unwrap();
            assert_eq!(w["remote"], targets[b]);
        }
        assert_eq!(writers[2]["blocking"], true);

        assert_eq!(done["event"], "lab_done");
        assert_eq!(done["reason"], "duration");
        let written: Vec<u64> = done["written"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        // stall ×2, stall-blocking, fast, slow, upclose
        let (stall, fast, slow, upclose) = (written[0], written[3], written[4], written[5]);
        assert!(stall > 0 && stall < 64 * 1024 * 1024, "{written:?}"); // kernel buffers, then stuck
        assert!(fast > stall, "{written:?}");
        assert!(slow > 0, "{written:?}");
        assert!(upclose >= targets::UPCLOSE_BYTES, "{written:?}");
    }
}
