//! The text exposition (format 0.0.4) of a [`Snapshot`], by `prometheus-client`.
//!
//! A fresh registry per scrape: the snapshot holds absolute values, and
//! building a few dozen metrics costs microseconds at scrape rate.

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use hystall_common::counter;

use super::snapshot::Snapshot;

/// `Content-Type` of what [`encode`] returns.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

type Labels = Vec<(&'static str, String)>;

const VERDICTS: [&str; 3] = ["ok", "slow", "stalled"];
const CONFIDENCES: [&str; 3] = ["suspected", "likely", "confirmed"];

/// The exposition of `s`; `up` is false once the pipeline has stopped ticking.
pub fn encode(s: &Snapshot, up: bool) -> Result<String, std::fmt::Error> {
    let mut r = Registry::with_prefix("hystall");
    r.register("build", "hystall's version", Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]));
    gauge(&mut r, "up", "1 while the pipeline publishes (0: none yet, or none for 5 s)", up.into());

    // Targets and connections, now.
    gauge(&mut r, "stalled_targets", "Target sockets whose sends made no progress for the stall timeout", s.targets[2]);
    gauge(&mut r, "slow_targets", "Target sockets blocked for a while but still making progress", s.targets[1]);
    gauges(
        &mut r,
        "target_sockets",
        "Open target sockets (connected by the watched processes), by verdict",
        VERDICTS.iter().zip(s.targets).map(|(v, n)| (vec![("verdict", (*v).to_owned())], n)),
    );
    gauges(
        &mut r,
        "starved_connections",
        "QUIC connections starved by stalled targets, by the detector's confidence",
        CONFIDENCES.iter().zip(s.starved).map(|(c, n)| (vec![("confidence", (*c).to_owned())], n)),
    );
    gauge(&mut r, "quic_connections", "QUIC connections seen on the server ports and not idle", s.quic_connections);

    gauges(
        &mut r,
        "table_entries",
        "Entries of hystall's own tables (sockets, connections, flows, retired_flows, attributed_targets, byte_series): flat on a healthy node",
        s.tables.rows().into_iter().map(|(t, n)| (vec![("table", t.to_owned())], n)),
    );

    // What happened, since start.
    let t = &s.totals;
    count(&mut r, "starvation_events", "QUIC connections that became starved", t.starvations);
    count(&mut r, "recoveries", "Starved QUIC connections that recovered", t.recoveries);
    counts(
        &mut r,
        "events",
        "Events emitted, by kind (the JSON lines' event names)",
        t.events.iter().map(|(e, n)| (vec![("event", (*e).to_owned())], *n)),
    );
    counts(
        &mut r,
        "enforcement_actions",
        "Enforcement actions on stalled targets (--enforce), by action and result",
        t.actions
            .iter()
            .map(|((a, res), n)| (vec![("action", (*a).to_owned()), ("result", res.as_str().to_owned())], *n)),
    );
    count(&mut r, "enforcement_refusals", "Enforcement decisions refused (rate limit)", t.refusals);

    // The kernel side.
    let k = &s.kernel;
    let c = |i: u32| k.counters.get(i as usize).copied().unwrap_or(0);
    counts(
        &mut r,
        "kernel_events",
        "Events the kernel programs wrote to their ring buffers",
        [(vec![("ring", "events".to_owned())], c(counter::EVENTS_SENT))],
    );
    counts(
        &mut r,
        "kernel_events_lost",
        "Kernel events lost to a full ring buffer (verdicts may lag)",
        [
            (vec![("ring", "events".to_owned())], c(counter::EVENTS_LOST)),
            (vec![("ring", "samples".to_owned())], c(counter::SAMPLES_LOST)),
            (vec![("ring", "marks".to_owned())], c(counter::MARKS_LOST)),
            (vec![("ring", "secrets".to_owned())], c(counter::SECRETS_LOST)),
            (vec![("ring", "moved".to_owned())], c(counter::MOVED_LOST)),
        ],
    );
    count(
        &mut r,
        "kernel_packets_not_passed",
        "Packets of connections selected for decryption (--decrypt) not passed: ring full or the connection's byte budget spent",
        c(counter::PACKETS_LOST),
    );
    count(
        &mut r,
        "kernel_map_evicted",
        "Flows the kernel's LRU flow map evicted to make room (it is too small for this node)",
        k.flows_evicted,
    );
    counts(
        &mut r,
        "kernel_map_full",
        "Kernel map inserts that failed because the map was full",
        [
            (vec![("map", "socks".to_owned())], c(counter::MAP_FULL)),
            (vec![("map", "flows".to_owned())], c(counter::FLOWS_FULL)),
        ],
    );
    gauges(
        &mut r,
        "kernel_map_entries",
        "Entries in the kernel maps that grow with traffic (counted every 10 s)",
        k.maps.iter().map(|m| (vec![("map", m.map.to_owned())], m.entries)),
    );
    gauges(
        &mut r,
        "kernel_map_capacity",
        "Capacity (max entries) of those kernel maps",
        k.maps.iter().map(|m| (vec![("map", m.map.to_owned())], m.capacity)),
    );
    count(
        &mut r,
        "kernel_udp_packets",
        "UDP packets on the server ports counted by the classifier",
        c(counter::UDP_PACKETS),
    );
    count(&mut r, "kernel_unparsed_packets", "Packets the classifier could not parse", c(counter::UNPARSED));
    count(
        &mut r,
        "kernel_execs_skipped",
        "Process starts the kernel did not hand to hystall: not of the selection",
        c(counter::EXECS_SKIPPED),
    );
    gauges(
        &mut r,
        "probe_attached",
        "Whether each kernel program is attached (1) or not (0)",
        k.probes.iter().map(|p| (vec![("program", p.program.clone())], u64::from(p.attached))),
    );
    gauge(
        &mut r,
        "probes_degraded",
        "Kernel programs that failed to attach (on-demand ones not yet needed excluded)",
        k.probes.iter().filter(|p| !p.attached && !p.waiting).count() as u64,
    );
    gauge(
        &mut r,
        "quic_server_ports",
        "QUIC server ports watched (0: no QUIC connection can be seen; watch_started and quic_ports_changed say why)",
        k.quic_server_ports,
    );
    gauge(
        &mut r,
        "quic_candidate_ports",
        "UDP ports of the watched processes waiting for a client's Initial to show they serve QUIC",
        k.quic_candidate_ports,
    );
    gauge(
        &mut r,
        "probe_stats_enabled",
        "BPF run-time statistics are collected (else run times stay 0)",
        k.stats_enabled.into(),
    );
    let run_time = Family::<Labels, Counter<f64, std::sync::atomic::AtomicU64>>::default();
    let run_count = Family::<Labels, Counter>::default();
    for p in &k.progs {
        run_time.get_or_create(&vec![("program", p.program.clone())]).inc_by(p.run_time.as_secs_f64());
        run_count.get_or_create(&vec![("program", p.program.clone())]).inc_by(p.run_count);
    }
    r.register_with_unit("probe_run_time", "Time spent in each kernel program", Unit::Seconds, run_time);
    r.register("probe_run_count", "Runs of each kernel program", run_count);

    let mut out = String::new();
    prometheus_text::encode(&mut out, &r)?;
    Ok(out)
}

fn gauge(r: &mut Registry, name: &str, help: &str, v: u64) {
    let g = Gauge::<i64>::default();
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
    r.register(name, help, g);
}

fn gauges(r: &mut Registry, name: &str, help: &str, rows: impl IntoIterator<Item = (Labels, u64)>) {
    let f = Family::<Labels, Gauge>::default();
    for (labels, v) in rows {
        f.get_or_create(&labels).set(i64::try_from(v).unwrap_or(i64::MAX));
    }
    r.register(name, help, f);
}

fn count(r: &mut Registry, name: &str, help: &str, v: u64) {
    let c = Counter::<u64>::default();
    c.inc_by(v);
    r.register(name, help, c);
}

fn counts(r: &mut Registry, name: &str, help: &str, rows: impl IntoIterator<Item = (Labels, u64)>) {
    let f = Family::<Labels, Counter>::default();
    for (labels, v) in rows {
        f.get_or_create(&labels).inc_by(v);
    }
    r.register(name, help, f);
}

#[cfg(test)]
mod tests;
