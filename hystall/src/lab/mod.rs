//! Reproductions of the failure on loopback, for newcomers, self-tests and tests.

pub mod quic;
pub mod targets;
pub mod tcp;

use crate::cli::{LabArgs, LabKind};

pub fn run(args: LabArgs) -> anyhow::Result<()> {
    match args.kind {
        Some(LabKind::Tcp(a)) => tcp::run(a),
        Some(LabKind::Churn(a)) => quic::churn::run(a),
        Some(LabKind::Node(a)) => quic::node::run(a),
        None => quic::run(args),
    }
}
