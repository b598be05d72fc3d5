//! A bounds-checked cursor over decrypted payloads, with QUIC's
//! variable-length integers (RFC 9000 §16).

/// Reads fields from a byte slice; every read says which field fails.
#[derive(Debug, Clone)]
pub(super) struct Cursor<'a> {
    buf: &'a [u8],
    pub(super) pos: usize,
}

/// A field ran past the end of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Short {
    pub(super) what: &'static str,
    pub(super) at: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub(super) fn remaining(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    /// The bytes read since position `start`.
    pub(super) fn since(&self, start: usize) -> &'a [u8] {
        self.buf.get(start..self.pos).unwrap_or_default()
    }

    pub(super) fn peek_u8(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    pub(super) fn u8(&mut self, what: &'static str) -> Result<u8, Short> {
        let [b] = self.array(what)?;
        Ok(b)
    }

    pub(super) fn take(&mut self, len: usize, what: &'static str) -> Result<&'a [u8], Short> {
        let short = Short { what, at: self.pos };
        let end = self.pos.checked_add(len).ok_or(short)?;
        let out = self.buf.get(self.pos..end).ok_or(short)?;
        self.pos = end;
        Ok(out)
    }

    /// A length-prefixed field whose length is a varint.
    pub(super) fn take_var(&mut self, len: u64, what: &'static str) -> Result<&'a [u8], Short> {
        // A length past usize::MAX cannot fit either: report it as short.
        self.take(usize::try_from(len).unwrap_or(usize::MAX), what)
    }

    pub(super) fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Short> {
        let at = self.pos;
        self.take(N, what)?.try_into().map_err(|_| Short { what, at })
    }

    /// A variable-length integer: the two high bits of the first byte give
    /// its length (1, 2, 4 or 8 bytes).
    pub(super) fn varint(&mut self, what: &'static str) -> Result<u64, Short> {
        let at = self.pos;
        let first = self.peek_u8().ok_or(Short { what, at })?;
        let len = 1usize << (first >> 6);
        let bytes = self.take(len, what)?;
        Ok(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)) & (u64::MAX >> (64 - 8 * len + 2)))
    }
}

#[cfg(test)]
mod tests {
    use super::Cursor;

    #[test]
    fn rfc9000_a1_varint_examples() {
        for (bytes, value) in [
            (&[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c][..], 151_288_809_941_952_652),
            (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
            (&[0x7b, 0xbd], 15_293),
            (&[0x25], 37),
            (&[0x40, 0x25], 37),
        ] {
            let mut c = Cursor::new(bytes);
            assert_eq!(c.varint("v"), Ok(value));
            assert!(c.is_empty());
        }
        assert!(Cursor::new(&[0x80, 1, 2]).varint("v").is_err());
        assert!(Cursor::new(&[]).varint("v").is_err());
    }
}
