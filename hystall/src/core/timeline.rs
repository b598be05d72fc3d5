//! A run as data: what the sources saw and when the model was judged. Live runs
//! are recorded as timelines (`hystall record`), captures are turned into them
//! (`hystall pcap`), and both are played back through the same model
//! (`--replay`), so an incident gives the same verdicts after the fact.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::detector::{DetectorConfig, Windows};
use super::model::Model;
use super::observation::Observation;
use super::time::Mono;
use super::verdict::Thresholds;

/// One step of a timeline. Steps are streamed one at a time, never stored in
/// bulk, so the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Step {
    /// Something a source saw (applied to the model in order).
    Obs(Observation),
    /// The model was judged at this time (the live pipeline's tick).
    Tick(Mono),
}

/// The options a timeline was judged with; a replay rebuilds the same model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelOptions {
    pub stall_timeout_ms: u64,
    pub quic_idle_ms: u64,
    pub stream_window: u64,
    pub conn_window: u64,
}

impl ModelOptions {
    pub fn model(&self) -> Model {
        let th = Thresholds { stall_timeout: Duration::from_millis(self.stall_timeout_ms), ..Thresholds::default() };
        let windows = Windows { stream: self.stream_window, conn: self.conn_window };
        let detector = DetectorConfig { windows, stall_timeout: th.stall_timeout, ..Default::default() };
        Model::new(th, Duration::from_millis(self.quic_idle_ms), detector)
    }
}

/// Plays a timeline into a model: `advance_to` applies every step up to a time
/// and returns the events the ticks produced. Pure: the caller owns the clock
/// (as fast as possible for `watch --replay`, real time for `top --replay`).
pub struct Player<I: Iterator<Item = Step>> {
    pub model: Model,
    steps: std::iter::Peekable<I>,
    /// The time of the last step applied.
    pub now: Mono,
    /// The time of the first step (the start of the run).
    pub start: Option<Mono>,
}

impl<I: Iterator<Item = Step>> Player<I> {
    pub fn new(model: Model, steps: I) -> Self {
        let mut steps = steps.peekable();
        let start = steps.peek().map(step_time);
        Player { model, steps, now: start.unwrap_or_default(), start }
    }

    /// Applies every step at or before `t`; the events of the ticks among them.
    pub fn advance_to(&mut self, t: Mono) -> Vec<super::event::Stamped> {
        self.advance(t, usize::MAX)
    }

    /// Like `advance_to`, but at most `limit` steps (a dashboard keeps
    /// answering keys while a big file plays; the rest comes next time).
    pub fn advance(&mut self, t: Mono, limit: usize) -> Vec<super::event::Stamped> {
        let mut out = Vec::new();
        let mut n = 0;
        while n < limit
            && let Some(s) = self.steps.next_if(|s| step_time(s) <= t)
        {
            n += 1;
            self.now = self.now.max(step_time(&s));
            match s {
                Step::Obs(o) => self.model.apply(o),
                Step::Tick(at) => out.extend(self.model.tick(at)),
            }
        }
        out
    }

    /// The time of the next step, `None` at the end.
    pub fn next_at(&mut self) -> Option<Mono> {
        self.steps.peek().map(step_time)
    }

    /// Plays everything; all events.
    pub fn run_to_end(&mut self) -> Vec<super::event::Stamped> {
        self.advance_to(Mono(u64::MAX))
    }
}

fn step_time(s: &Step) -> Mono {
    match s {
        Step::Obs(o) => o.at(),
        Step::Tick(t) => *t,
    }
}
