//! Byte marks: the moments a flow's client → server bytes, or a target socket's
//! sent bytes, cross a multiple of [`MARK_BYTES`]. They give user space both
//! byte series at the kernel's own timestamps — the resolution that tying a
//! target to the connection that fed it needs when many clients upload at
//! once — at a cost that grows with the bytes moved, not with packets or
//! connections (an idle connection emits none). One policy, [`crossed`], for
//! the kernel programs and the capture reader.

use crate::flow::FlowKey;

/// Marks fall every 2^MARK_SHIFT bytes (128 KiB: ~90 full-size QUIC packets).
pub const MARK_SHIFT: u32 = 17;
pub const MARK_BYTES: u64 = 1 << MARK_SHIFT;
pub const MARKS_RING_BYTES: u32 = 1 << 21;

/// `Mark::kind`: a UDP flow's client → server payload bytes (the flow's
/// count over all CPUs).
pub const MARK_FLOW: u32 = 1;
/// `Mark::kind`: bytes a watched process's sends moved into an outbound socket.
pub const MARK_SEND: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    pub kind: u32,
    /// The CPU whose count `bytes` is: always 0 now that the flow map is one
    /// for all CPUs (recordings of the per-CPU map carry the CPU).
    pub cpu: u32,
    pub ts_ns: u64,
    /// The cumulative count after the packet or send that crossed the mark.
    pub bytes: u64,
    /// The socket (MARK_SEND).
    pub cookie: u64,
    /// The flow (MARK_FLOW).
    pub flow: FlowKey,
}

/// Whether going from `before` to `after` bytes crosses a mark.
#[inline(always)]
pub fn crossed(before: u64, after: u64) -> bool {
    (before >> MARK_SHIFT) != (after >> MARK_SHIFT)
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::Mark {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_falls_on_each_multiple() {
        assert!(!crossed(0, MARK_BYTES - 1));
        assert!(crossed(MARK_BYTES - 1, MARK_BYTES));
        assert!(!crossed(MARK_BYTES, 2 * MARK_BYTES - 1));
        assert!(crossed(10, 5 * MARK_BYTES), "one mark for a jump over several");
    }
}
