//! Command line: `hystall watch|top|doctor|lab|pcap` (names are a stable interface,
//! see docs/EVENTS.md and ../shared/DESIGN.md §7).

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
    /// Say which probes and mechanisms work on this kernel, and what to do.
    Doctor(DoctorArgs),
    /// Reproduce the failure on loopback (targets that stall, slow, ...).
    Lab(LabArgs),
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
    /// Seconds without send progress before a blocked socket is STALLED
    /// (the upstream fix's value by default).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub stall_timeout: f64,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub select: Selection,
    /// One JSON object per line (schema: docs/EVENTS.md).
    #[arg(long)]
    pub json: bool,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LabArgs {
    #[command(subcommand)]
    pub kind: Option<LabKind>,
}

#[derive(Debug, Subcommand)]
pub enum LabKind {
    /// TCP writers into targets of the four behaviours (no QUIC): the socket side
    /// of the failure, in a process of its own.
    Tcp(TcpLabArgs),
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
    /// Bytes per write call.
    #[arg(long, default_value_t = 32 * 1024)]
    pub chunk: usize,
    /// Write this path as well as stdout with the ready line (for scripts).
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
}
