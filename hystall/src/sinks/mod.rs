//! Sinks: where events go (text or JSON lines, ...). They know nothing of the
//! kernel; they only format what the core decided.

pub mod enforcer;
pub mod lines;
pub mod metrics;
pub mod recorder;
pub mod report;
pub mod svg;
pub mod tui;
