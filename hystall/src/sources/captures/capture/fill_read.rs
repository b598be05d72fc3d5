//! A `Read` adapter for pcap-parser's readers.
//!
//! pcap-parser fills its buffer with a single `read` call and maps every I/O error to a
//! bare `ReadError`. This adapter loops until the buffer is full or the input ends (so
//! pipes and chained prefixes read like files) and keeps the real `io::Error` aside so
//! the caller can report it.

use std::io::{self, Read};
use std::sync::{Arc, Mutex};

/// The last I/O error seen by a [`FillRead`], shared with whoever reports it.
pub(super) type IoErrorSlot = Arc<Mutex<Option<io::Error>>>;

pub(super) struct FillRead<R> {
    inner: R,
    error: IoErrorSlot,
}

impl<R: Read> FillRead<R> {
    pub(super) fn new(inner: R) -> (Self, IoErrorSlot) {
        let error = IoErrorSlot::default();
        (FillRead { inner, error: error.clone() }, error)
    }
}

impl<R: Read> Read for FillRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while let Some(rest) = buf.get_mut(filled..) {
            if rest.is_empty() {
                break;
            }
            match self.inner.read(rest) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Hand over what we have; the error comes back at the next call.
                Err(_) if filled > 0 => break,
                Err(e) => {
                    let kind = e.kind();
                    if let Ok(mut slot) = self.error.lock() {
                        *slot = Some(e);
                    }
                    return Err(io::Error::from(kind));
                }
            }
        }
        Ok(filled)
    }
}

/// Takes the stashed error, or makes a generic one if the adapter saw none.
pub(super) fn take_error(slot: &IoErrorSlot) -> io::Error {
    slot.lock().ok().and_then(|mut s| s.take()).unwrap_or_else(|| io::Error::other("read failed"))
}
