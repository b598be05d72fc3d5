//! `--metrics ADDR:PORT` for `watch` and `top`: feeds the Prometheus exporter
//! (`sinks::metrics`) from the pipeline after every tick.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::pipeline::Pipeline;
use crate::core::event::Stamped;
use crate::sinks::metrics::{Exporter, Kernel, ProbeGauge, Snapshot, Totals};
use crate::sources::kernel::probes::{is_waiting, stats::StatsGuard};

/// A scrape sees figures at most this old. Building them walks every
/// connection and socket and reads every program's statistics: on a node,
/// five times a second of that was a tenth of hystall's own CPU, for
/// scrapes that come every 15 s or so.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

pub struct Metrics {
    exporter: Exporter,
    totals: Totals,
    /// When the exporter last got a snapshot.
    published: Option<Instant>,
    /// BPF run-time statistics stay enabled while the exporter runs.
    stats: StatsGuard,
}

impl Metrics {
    /// Binds the exporter's address (before the probes: a taken port is a
    /// one-line error and nothing else started) and enables BPF statistics.
    pub fn start(addr: Option<SocketAddr>) -> Result<Option<Metrics>> {
        let Some(addr) = addr else { return Ok(None) };
        let exporter = Exporter::start(addr)?;
        let stats = StatsGuard::enable();
        if let Some(e) = &stats.error {
            tracing::info!("BPF run-time statistics not enabled ({e}): probe run times stay 0 unless the sysctl is on");
        }
        Ok(Some(Metrics { exporter, totals: Totals::default(), published: None, stats }))
    }

    /// Counts `events`, and publishes what the pipeline looks like now (at most
    /// once a `PUBLISH_EVERY`).
    pub fn update(&mut self, p: &Pipeline, events: &[Stamped]) {
        self.totals.observe(events);
        if self.published.is_some_and(|t| t.elapsed() < PUBLISH_EVERY) {
            return;
        }
        self.published = Some(Instant::now());
        let probes = p
            .live
            .probe_status()
            .iter()
            .map(|s| ProbeGauge { program: s.name.clone(), attached: s.attached, waiting: is_waiting(s) })
            .collect();
        let kernel = Kernel {
            counters: p.live.counters(),
            probes,
            progs: p.live.prog_stats(),
            stats_enabled: self.stats.enabled(),
            maps: p.live.map_fill.clone(),
            flows_evicted: p.live.flows_evicted(),
            quic_server_ports: p.live.quic_port_counts().0 as u64,
            quic_candidate_ports: p.live.quic_port_counts().1 as u64,
        };
        self.exporter.publish(Snapshot::new(&p.model, &self.totals, kernel));
    }
}
