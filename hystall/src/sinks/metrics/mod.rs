//! The Prometheus exporter (`watch --metrics ADDR:PORT`).
//!
//! The pipeline's thread computes a [`Snapshot`] every tick (gauges from the
//! model, counters from the events it emitted, the kernel's own counters) and
//! hands it to the HTTP thread ([`Exporter`]), which only encodes the latest
//! one on each scrape. Labels are bounded: verdicts, confidences, event kinds,
//! program names; never a connection, a socket or an address.

mod encode;
mod server;
mod snapshot;

pub use encode::encode;
pub use server::{Exporter, MetricsError};
pub use snapshot::{EnforceResult, Kernel, ProbeGauge, Snapshot, Tables, Totals};
