//! Monotonic time as the kernel counts it (`bpf_ktime_get_ns`, CLOCK_MONOTONIC).

use std::time::Duration;

/// Nanoseconds of CLOCK_MONOTONIC. Kernel timestamps and user-space "now" share
/// this clock, so they compare directly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Mono(pub u64);

impl Mono {
    pub const ZERO: Mono = Mono(0);

    pub fn from_secs_f64(s: f64) -> Mono {
        Mono((s * 1e9) as u64)
    }

    /// `self - earlier`, zero when `earlier` is later.
    pub fn since(self, earlier: Mono) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// Kernel times use 0 for "never".
    pub fn nonzero(ns: u64) -> Option<Mono> {
        (ns != 0).then_some(Mono(ns))
    }
}

/// Maps `Mono` to wall-clock time for output.
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    /// realtime - monotonic, in nanoseconds, taken once at start.
    offset_ns: i128,
}

impl WallClock {
    /// Reads both clocks now.
    pub fn now() -> WallClock {
        let mono = mono_now().0 as i128;
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
        WallClock { offset_ns: real - mono }
    }

    /// A fixed offset (tests, replays).
    pub const fn fixed(offset_ns: i128) -> WallClock {
        WallClock { offset_ns }
    }

    /// realtime − monotonic, in nanoseconds (kept in recordings).
    pub fn offset_ns(&self) -> i128 {
        self.offset_ns
    }

    /// Unix time in nanoseconds of `t`.
    pub fn unix_ns(&self, t: Mono) -> i128 {
        (t.0 as i128).saturating_add(self.offset_ns)
    }

    /// RFC 3339 UTC with milliseconds, e.g. `2026-12-02T13:04:05.123Z`.
    pub fn rfc3339(&self, t: Mono) -> String {
        match jiff::Timestamp::from_nanosecond(self.unix_ns(t)) {
            Ok(ts) => format!("{ts:.3}"),
            Err(_) => String::from("1970-01-01T00:00:00.000Z"),
        }
    }
}

/// CLOCK_MONOTONIC now.
pub fn mono_now() -> Mono {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    Mono(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_has_millis_and_z() {
        let w = WallClock::fixed(1_764_680_645_123_000_000);
        assert_eq!(w.rfc3339(Mono(0)), "2025-12-02T13:04:05.123Z");
    }

    #[test]
    fn since_saturates() {
        assert_eq!(Mono(5).since(Mono(10)), Duration::ZERO);
        assert_eq!(Mono(10).since(Mono(4)), Duration::from_nanos(6));
    }
}
