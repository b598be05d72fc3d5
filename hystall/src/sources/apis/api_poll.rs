//! One poller for the servers' HTTP APIs (Hysteria's stream table, the Clash
//! API's connection list): a thread of its own that fetches every so often and
//! sends what it gets; a failure is logged once per change of error, and
//! polling goes on.

use std::sync::mpsc::Sender;
use std::time::Duration;

use crate::core::observation::Observation;

/// Calls `fetch` every `every` with an HTTP agent (2 s timeout) until the
/// receiver of `tx` is gone.
pub fn spawn<E: std::fmt::Display>(
    every: Duration,
    tx: Sender<Observation>,
    mut fetch: impl FnMut(&ureq::Agent) -> Result<Observation, E> + Send + 'static,
) {
    std::thread::spawn(move || {
        let agent: ureq::Agent =
            ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(2))).build().into();
        let mut last_err = String::new();
        loop {
            match fetch(&agent) {
                Ok(obs) => {
                    last_err.clear();
                    if tx.send(obs).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    if msg != last_err {
                        tracing::warn!("{msg}");
                        last_err = msg;
                    }
                }
            }
            std::thread::sleep(every);
        }
    });
}
