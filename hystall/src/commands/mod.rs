//! One module per subcommand: each wires sources → core → sinks.

pub mod caps;
pub mod doctor;
pub mod lab_side;
pub mod metrics;
pub mod others;
pub mod pcap;
pub mod pcap_bytes;
pub mod pipeline;
pub mod record;
pub mod replay;
pub mod top;
pub mod watch;

/// The model options from the command line (seconds and MiB), checked: the
/// same rules for a live run, a capture and a capture's replay.
pub fn model_options(
    stall_timeout: f64,
    quic_idle: f64,
    stream_window: f64,
    conn_window: f64,
) -> anyhow::Result<crate::core::timeline::ModelOptions> {
    anyhow::ensure!(
        stall_timeout > 0.0 && stall_timeout.is_finite(),
        "--stall-timeout must be a positive number of seconds"
    );
    anyhow::ensure!(quic_idle > 0.0 && quic_idle.is_finite(), "--quic-idle must be a positive number of seconds");
    anyhow::ensure!(
        stream_window > 0.0 && conn_window > 0.0 && stream_window.is_finite() && conn_window.is_finite(),
        "--stream-window and --conn-window must be positive (MiB)"
    );
    Ok(crate::core::timeline::ModelOptions {
        stall_timeout_ms: (stall_timeout * 1000.0) as u64,
        quic_idle_ms: (quic_idle * 1000.0) as u64,
        stream_window: (stream_window * 1048576.0) as u64,
        conn_window: (conn_window * 1048576.0) as u64,
    })
}
