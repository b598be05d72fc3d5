//! Command line: `hystall watch|top|doctor|lab|pcap` (names are a stable interface,
//! see docs/EVENTS.md).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "hystall",
    version,
    about = "Finds QUIC proxy connections starved by stalled TCP targets, live, from outside the server."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stream events (stalled target sockets, ...) as lines of text or JSON.
    Watch(WatchArgs),
    /// The live dashboard: starved connections, the targets that hold them, timelines.
    Top(TopArgs),
    /// Say which probes and mechanisms work on this kernel, and what to do.
    Doctor(DoctorArgs),
    /// Reproduce the failure on loopback (targets that stall, slow, ...).
    Lab(LabArgs),
    /// Watch like `watch` and save what the probes saw to FILE (size-bounded,
    /// rotated), to replay later with `watch --replay` or `top --replay`.
    Record(RecordArgs),
    /// Triage a capture (pcap/pcapng, from the phone or the server) offline:
    /// per QUIC connection its timeline and verdict; exact with a TLS key log.
    Pcap(PcapArgs),
}

#[derive(Debug, Args)]
pub struct PcapArgs {
    /// The capture (pcap or pcapng; tcpdump, tshark, dumpcap, PCAPdroid, ...).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// TLS key log (SSLKEYLOGFILE format) to decrypt the QUIC packets; secrets
    /// in the capture (pcapng Decryption Secrets Blocks) are used as well.
    #[arg(long, value_name = "FILE")]
    pub keylog: Option<PathBuf>,
    /// JSON lines: the same events as `watch --json`, then a `pcap_summary`.
    #[arg(long)]
    pub json: bool,
    /// Draw the timeline (stream data vs other traffic, the stall marked) to this SVG file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// QUIC server UDP port or range LO-HI (repeatable), for connections whose
    /// handshake is not in the capture.
    #[arg(long = "port", value_name = "P|LO-HI", value_parser = parse_ports)]
    pub ports: Vec<PortRange>,
    /// Seconds without send progress before a target socket (TCP in the capture) is STALLED.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub stall_timeout: f64,
    /// Seconds without any packet before a QUIC connection counts as closed.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub quic_idle: f64,
    /// The server's per-stream receive window, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 8.0)]
    pub stream_window: f64,
    /// The server's per-connection receive window, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 20.0)]
    pub conn_window: f64,
}

/// Which processes and sockets to watch; shared by `watch` and `top`.
#[derive(Debug, Clone, Args, Default)]
pub struct Selection {
    /// Watch this process (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Watch processes with this name, as in /proc/PID/comm (repeatable).
    #[arg(long = "comm", value_name = "NAME")]
    pub comms: Vec<String>,
    /// Watch the processes of this cgroup v2 and below it (repeatable): a path
    /// under the cgroup2 mount, or relative to its root ("/system.slice/x.service").
    /// Followed across restarts.
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<String>,
    /// Watch the processes of this systemd unit (repeatable), by its cgroup;
    /// without systemd, the cgroup directory named NAME or NAME.service.
    #[arg(long = "unit", value_name = "NAME")]
    pub units: Vec<String>,
    /// Seconds without send progress before a blocked socket is STALLED
    /// (the upstream fix's value by default).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub stall_timeout: f64,
    /// QUIC server UDP port or port-hopping range LO-HI (repeatable), besides
    /// those discovered from the watched processes' UDP sockets.
    #[arg(long = "port", value_name = "P|LO-HI", value_parser = parse_ports)]
    pub ports: Vec<PortRange>,
    /// Interface to watch QUIC traffic on (repeatable; default: every interface
    /// that is up, loopback included).
    #[arg(long = "iface", value_name = "IF")]
    pub ifaces: Vec<String>,
    /// Seconds without any packet before a QUIC connection counts as closed.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub quic_idle: f64,
    /// The server's per-stream receive window, in MiB (Hysteria's default).
    #[arg(long, value_name = "MIB", default_value_t = 8.0)]
    pub stream_window: f64,
    /// The server's per-connection receive window, in MiB (Hysteria's default).
    #[arg(long, value_name = "MIB", default_value_t = 20.0)]
    pub conn_window: f64,
    /// Hysteria's Traffic Stats API (e.g. http://127.0.0.1:9999): its stream
    /// table confirms a starvation exactly (`confidence: confirmed`).
    #[arg(long, value_name = "URL")]
    pub hysteria_api: Option<String>,
    /// The API's secret (sent as the Authorization header).
    #[arg(long, value_name = "SECRET", requires = "hysteria_api")]
    pub hysteria_secret: Option<String>,
    /// The Clash API of sing-box (`experimental.clash_api`) or mihomo
    /// (`external-controller`), e.g. http://127.0.0.1:9090: its connection
    /// list ties each target to its QUIC connection exactly. Found by itself
    /// in the watched servers' configs when readable.
    #[arg(long, value_name = "URL")]
    pub clash_api: Option<String>,
    /// The Clash API's secret (sent as a Bearer token).
    #[arg(long, value_name = "SECRET", requires = "clash_api")]
    pub clash_secret: Option<String>,
    /// Do not look for a Clash API in the watched servers' configs.
    #[arg(long)]
    pub no_clash_api: bool,
    /// Read the frames of suspect connections live with the server's own TLS
    /// secrets (a uprobe on Go's crypto/tls key-log function in the watched
    /// servers; x86_64): a starvation is then `confirmed` from its frames.
    /// Secrets stay in memory unless --keylog-out is given.
    #[arg(long)]
    pub decrypt: bool,
    /// With --decrypt: also append every secret read to FILE (SSLKEYLOGFILE
    /// format, mode 0600), e.g. for `hystall pcap --keylog FILE` of a capture.
    #[arg(long, value_name = "FILE", requires = "decrypt")]
    pub keylog_out: Option<PathBuf>,
}

/// An inclusive UDP port range (a single port is LO = HI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub lo: u16,
    pub hi: u16,
}

impl PortRange {
    pub fn ports(&self) -> impl Iterator<Item = u16> {
        self.lo..=self.hi
    }
}

pub fn parse_ports(s: &str) -> Result<PortRange, String> {
    let port = |p: &str| -> Result<u16, String> {
        match p.trim().parse::<u16>() {
            Ok(0) | Err(_) => Err(format!("{p:?} is not a port (1-65535)")),
            Ok(n) => Ok(n),
        }
    };
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (port(a)?, port(b)?),
        None => (port(s)?, port(s)?),
    };
    if lo > hi {
        return Err(format!("port range {s:?} runs backwards"));
    }
    Ok(PortRange { lo, hi })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_ranges_parse_and_bad_ones_say_why() {
        assert_eq!(parse_ports("443"), Ok(PortRange { lo: 443, hi: 443 }));
        assert_eq!(parse_ports("20000-20010").map(|r| r.ports().count()), Ok(11));
        assert!(parse_ports("0").unwrap_err().contains("not a port"));
        assert!(parse_ports("9-1").unwrap_err().contains("backwards"));
        assert!(parse_ports("x").is_err());
    }
}

/// `--lab`: run the built-in QUIC lab beside the monitor and watch it.
#[derive(Debug, Clone, Args)]
pub struct LabSide {
    /// Run the built-in QUIC lab (`hystall lab`) in a child process and watch it:
    /// the starvation signature on this machine, with one command.
    #[arg(long)]
    pub lab: bool,
    /// With --lab: parallel uploads.
    #[arg(long, value_name = "N", default_value_t = 4, requires = "lab")]
    pub lab_uploads: usize,
    /// With --lab: how the lab's targets behave.
    #[arg(long, value_enum, value_name = "B", default_value_t = Behaviour::Stall, requires = "lab")]
    pub lab_target: Behaviour,
    /// With --lab: one more lab client (repeatable), `BEHAVIOUR:N[@SECS]` or `idle`
    /// (see `hystall lab --client`).
    #[arg(long = "lab-client", value_name = "SPEC", requires = "lab")]
    pub lab_clients: Vec<String>,
}

/// `--enforce`: the upstream fix's rule, applied from outside.
#[derive(Debug, Clone, Args, Default)]
pub struct EnforceArgs {
    /// Destroy target sockets whose sends made no progress for --stall-timeout
    /// (needs --pid/--comm/--cgroup/--unit or a detected proxy, and CAP_NET_ADMIN).
    #[arg(long)]
    pub enforce: bool,
    /// With --enforce: decide and report, touch nothing.
    #[arg(long, requires = "enforce")]
    pub dry_run: bool,
    /// With --enforce: never touch sockets to or from this IP, IP:PORT or :PORT (repeatable).
    #[arg(long, value_name = "ADDR", requires = "enforce")]
    pub exclude: Vec<String>,
    /// With --enforce: at most this many destroys a minute (more are refused and reported).
    #[arg(long, value_name = "N", default_value_t = 60, requires = "enforce")]
    pub max_destroys_per_minute: usize,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub select: Selection,
    #[command(flatten)]
    pub lab: LabSide,
    #[command(flatten)]
    pub enforce: EnforceArgs,
    /// One JSON object per line (schema: docs/EVENTS.md).
    #[arg(long)]
    pub json: bool,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    #[command(flatten)]
    pub replay: ReplaySide,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (docs/METRICS.md).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
}

/// `--replay FILE [--keylog KEYS]`: a file instead of the live node (`watch`
/// plays it as fast as it reads, `top` in recorded time at `--speed`).
#[derive(Debug, Clone, Args, Default)]
pub struct ReplaySide {
    /// Play back a recording (`hystall record`) or a capture (pcap/pcapng)
    /// through the detector instead of the live node.
    #[arg(long = "replay", value_name = "FILE", conflicts_with_all = ["lab", "enforce"])]
    pub file: Option<PathBuf>,
    /// With --replay of a capture: the TLS key log (SSLKEYLOGFILE) to decrypt it.
    #[arg(long, value_name = "FILE", requires = "file")]
    pub keylog: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Where to write the recording (older parts become FILE.1, FILE.2, ...).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    #[command(flatten)]
    pub select: Selection,
    #[command(flatten)]
    pub lab: LabSide,
    /// Rotate the file when it reaches this many MiB.
    #[arg(long, value_name = "MIB", default_value_t = 100)]
    pub max_size: u64,
    /// Keep this many rotated parts besides FILE (older ones are deleted).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub keep: u32,
    /// Print the events as JSON lines (default: text).
    #[arg(long)]
    pub json: bool,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub select: Selection,
    #[command(flatten)]
    pub lab: LabSide,
    #[command(flatten)]
    pub enforce: EnforceArgs,
    /// Redraw every this many milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=10_000))]
    pub refresh: u64,
    /// Quit after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    #[command(flatten)]
    pub replay: ReplaySide,
    /// With --replay: playback speed (1 = as recorded; 0 = jump to the end).
    #[arg(long, value_name = "X", default_value_t = 1.0, requires = "file")]
    pub speed: f64,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (docs/METRICS.md).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also run the built-in lab under `watch` (about 15 s) and check that the
    /// whole signature shows: stalled targets, the QUIC connection, quic_starved.
    #[arg(long)]
    pub selftest: bool,
}

/// `hystall lab` with no subcommand runs the QUIC lab: a quinn proxy with Hysteria's
/// flow-control windows, a client with parallel uploads into targets of one
/// behaviour, and probes (a new stream, a datagram) that show what still works.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct LabArgs {
    #[command(subcommand)]
    pub kind: Option<LabKind>,
    /// Parallel upload streams, each copied by the proxy into its own target connection.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub uploads: usize,
    /// How the upload targets treat what the proxy writes to them.
    #[arg(long, value_enum, default_value_t = Behaviour::Stall)]
    pub target: Behaviour,
    /// Stop after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// UDP address of the QUIC proxy.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
    /// Append the TLS secrets to this file (SSLKEYLOGFILE format), to decrypt a capture.
    #[arg(long, value_name = "FILE")]
    pub keylog: Option<PathBuf>,
    /// Seconds between probe rounds (a new stream and a datagram).
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub probe_every: f64,
    /// Seconds a probe may take before it counts as failed.
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub probe_timeout: f64,
    /// Seconds between the ready line and the start of the uploads.
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    pub delay: f64,
    /// After the ready line, wait for a line on stdin before the extra
    /// clients connect and the delay starts (`watch --lab` writes it once
    /// its probes are attached: a fixed delay alone raced a slow start).
    #[arg(long, hide = true)]
    pub wait_go: bool,
    /// One more client (repeatable), its own QUIC connection: `BEHAVIOUR:N[@SECS]`
    /// (N uploads into targets of its own, SECS after the main uploads) or `idle`;
    /// e.g. `--client stall:4@3 --client fast:2 --client idle`.
    #[arg(long = "client", value_name = "SPEC")]
    pub clients: Vec<crate::lab::quic::clients::ClientSpec>,
    /// One JSON object per line (lab_ready, lab_target_connected, lab_target_closed,
    /// lab_probe, lab_done).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum LabKind {
    /// TCP writers into targets of the four behaviours (no QUIC): the socket side
    /// of the failure, in a process of its own.
    Tcp(TcpLabArgs),
    /// Thousands of short QUIC connections through the lab proxy into fast
    /// targets (a new UDP socket and a new target connection each): soak runs.
    Churn(ChurnLabArgs),
    /// A node's load in one process: many long-lived QUIC connections (each its
    /// own UDP socket) with a little periodic traffic, short connections made and
    /// closed at a steady rate, and long-lived target connections copied slowly
    /// into fast and slow targets: the node-scale benchmark's lab.
    Node(NodeLabArgs),
}

#[derive(Debug, Args)]
pub struct ChurnLabArgs {
    /// Stop starting connections after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub duration: f64,
    /// Client tasks, each making one connection after another.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub parallel: usize,
    /// Bytes each connection uploads through the proxy into its target.
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024)]
    pub upload: usize,
    /// UDP address of the QUIC proxy.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
}

#[derive(Debug, Args)]
pub struct NodeLabArgs {
    /// Long-lived client connections, each from a UDP socket of its own (its own 5-tuple).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub conns: usize,
    /// Short connections made and closed per second once the long-lived ones are
    /// up (each: a handshake, a small upload into a new target connection, a datagram).
    #[arg(long, value_name = "R", default_value_t = 50.0)]
    pub new_per_sec: f64,
    /// Long-lived streams, each copied by the proxy into a target connection that
    /// stays open (alternately a fast and a slow target), spread over the connections.
    #[arg(long, value_name = "T", default_value_t = 100)]
    pub targets: usize,
    /// Stop after this many seconds (from the ready line; the ramp-up included).
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub duration: f64,
    /// Each long-lived connection sends a datagram (echoed by the proxy) this often;
    /// the connections are spread evenly over the period.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub every: f64,
    /// Each long-lived target stream writes `--target-chunk` bytes this often.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub target_every: f64,
    /// Bytes per write of a long-lived target stream.
    #[arg(long, value_name = "BYTES", default_value_t = 1024)]
    pub target_chunk: usize,
    /// Bytes each short connection uploads into its target.
    #[arg(long, value_name = "BYTES", default_value_t = 4096)]
    pub short_upload: usize,
    /// Handshakes in flight while the long-lived connections are opened.
    #[arg(long, value_name = "K", default_value_t = 64)]
    pub ramp_parallel: usize,
    /// Seconds between `lab_stats` lines.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub stats_every: f64,
    /// UDP address of the QUIC proxy.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
}

/// How a lab target treats what is written to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Behaviour {
    /// Reads everything as fast as it comes.
    Fast,
    /// Reads a little, steadily (16 KiB every 100 ms).
    Slow,
    /// Reads a bit (64 KiB), then closes.
    Upclose,
    /// Never reads, never closes.
    Stall,
}

#[derive(Debug, Args)]
pub struct TcpLabArgs {
    /// Non-blocking writers (like Go's netpoll) into a never-reading target.
    #[arg(long, default_value_t = 0)]
    pub stall: usize,
    /// Blocking writers (one thread each, inside write()) into a never-reading target.
    #[arg(long, default_value_t = 0)]
    pub stall_blocking: usize,
    /// Writers into a target that reads everything.
    #[arg(long, default_value_t = 0)]
    pub fast: usize,
    /// Writers into a target that reads a little, steadily.
    #[arg(long, default_value_t = 0)]
    pub slow: usize,
    /// Writers into a target that reads a bit, then closes.
    #[arg(long, default_value_t = 0)]
    pub upclose: usize,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Seconds to wait after the ready line before writing (lets a watcher
    /// attach first, so the very first blocked send is seen live).
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    pub delay: f64,
    /// Seconds to wait before connecting the writers (the ready line comes
    /// after the connects: lets a watcher see the sockets made, not find
    /// them already there).
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    pub connect_after: f64,
    /// Bytes per write call.
    #[arg(long, default_value_t = 32 * 1024)]
    pub chunk: usize,
    /// Write this path as well as stdout with the ready line (for scripts).
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
}
