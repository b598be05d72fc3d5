//! hystall: finds QUIC proxy connections starved by stalled TCP targets.
//!
//! The crate is one pipeline (docs/ARCHITECTURE.md):
//! `sources` (kernel probes, sock_diag, /proc) produce `core::Observation`s;
//! `core` (pure, time is an input) keeps the model and makes verdicts and events;
//! `sinks` (watch lines, ...) show them. `commands` wires them per subcommand.

pub mod cli;
pub mod commands;
pub mod core;
pub mod lab;
pub mod sinks;
pub mod sources;
