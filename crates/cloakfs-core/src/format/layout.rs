//! Offset arithmetic between the plaintext view of a file and its backing (ciphertext) file.
//!
//! A non-empty backing file is `header || block_0 || block_1 || ...`. Every block but the last
//! holds `block_size` plaintext bytes and occupies `block_size + overhead` backing bytes; the last
//! may be shorter. An empty plaintext file is an empty backing file (no header). A suite that
//! keeps the header elsewhere (AES-256-XTS: an xattr) has a header length of 0 here.

/// Length of the per-file header whose key is derived from the volume key: 2-byte big-endian
/// version, 16-byte file ID. Files whose key is wrapped to recipients have a longer header
/// (the volume's [`Layout::header_len`], see `format::filekey`).
pub const HEADER_LEN: u64 = 18;

/// Why a backing length cannot be the length of a valid file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutError {
    /// Shorter than the header but not empty.
    TruncatedHeader,
    /// The last block is shorter than the per-block overhead.
    TruncatedBlock,
}

/// Block geometry of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    block: u64,
    overhead: u64,
    header: u64,
}

/// The plaintext blocks touched by a byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSpan {
    /// First block number.
    pub first: u64,
    /// Number of blocks (0 for an empty range).
    pub count: u64,
}

impl Layout {
    /// A layout with `block_size` plaintext bytes per block and `overhead` extra bytes per block.
    /// The header is the in-file one of `HEADER_LEN` bytes.
    pub const fn new(block_size: u64, overhead: u64) -> Self {
        Self::with_header(block_size, overhead, HEADER_LEN)
    }

    /// A layout whose blocks follow `header_len` bytes of header (0 where the header is kept
    /// outside the backing file's data).
    pub const fn with_header(block_size: u64, overhead: u64, header_len: u64) -> Self {
        Self {
            block: block_size,
            overhead,
            header: header_len,
        }
    }

    /// The same geometry behind a header of `header_len` bytes.
    pub const fn with_header_len(self, header_len: u64) -> Self {
        Self {
            header: header_len,
            ..self
        }
    }

    /// Backing bytes in front of the first block.
    pub const fn header_len(&self) -> u64 {
        self.header
    }

    /// Plaintext bytes per block.
    pub const fn block_size(&self) -> u64 {
        self.block
    }

    /// Extra backing bytes per block (nonce and tag).
    pub const fn overhead(&self) -> u64 {
        self.overhead
    }

    /// Backing bytes per full block.
    pub const fn cipher_block_size(&self) -> u64 {
        self.block + self.overhead
    }

    /// Backing offset where block `n` starts.
    pub const fn cipher_offset(&self, n: u64) -> u64 {
        self.header + n * self.cipher_block_size()
    }

    /// Plaintext offset where block `n` starts.
    pub const fn plain_offset(&self, n: u64) -> u64 {
        n * self.block
    }

    /// Number of plaintext bytes of block `n` in a file of `size` bytes (0 past the end).
    pub fn block_len(&self, n: u64, size: u64) -> u64 {
        size.saturating_sub(self.plain_offset(n)).min(self.block)
    }

    /// Number of blocks of a file of `size` plaintext bytes.
    pub fn block_count(&self, size: u64) -> u64 {
        size.div_ceil(self.block)
    }

    /// Blocks touched by `len` bytes at plaintext offset `off`.
    pub fn span(&self, off: u64, len: u64) -> BlockSpan {
        if len == 0 {
            return BlockSpan {
                first: off / self.block,
                count: 0,
            };
        }
        let first = off / self.block;
        let last = (off + len - 1) / self.block;
        BlockSpan {
            first,
            count: last - first + 1,
        }
    }

    /// Backing bytes of the blocks around any `len` plaintext bytes: at most one block more
    /// than `len` fills, each with its overhead.
    pub const fn read_room(&self, len: usize) -> usize {
        (len.div_ceil(self.block as usize) + 1) * self.cipher_block_size() as usize
    }

    /// Backing length of a file of `size` plaintext bytes.
    pub fn cipher_size(&self, size: u64) -> u64 {
        if size == 0 {
            return 0;
        }
        let full = size / self.block;
        let rest = size % self.block;
        let tail = if rest > 0 { rest + self.overhead } else { 0 };
        self.header + full * self.cipher_block_size() + tail
    }

    /// Plaintext length of a backing file of `cipher_len` bytes.
    pub fn plain_size(&self, cipher_len: u64) -> Result<u64, LayoutError> {
        if cipher_len == 0 {
            return Ok(0);
        }
        if cipher_len < self.header {
            return Err(LayoutError::TruncatedHeader);
        }
        let body = cipher_len - self.header;
        let full = body / self.cipher_block_size();
        let rest = body % self.cipher_block_size();
        match rest {
            0 => Ok(full * self.block),
            r if r <= self.overhead => Err(LayoutError::TruncatedBlock),
            r => Ok(full * self.block + r - self.overhead),
        }
    }

    /// Like [`Layout::plain_size`], but a damaged tail counts as absent: the size that `stat`
    /// reports for a damaged file (reads of the damaged part fail with EIO).
    pub fn plain_size_lenient(&self, cipher_len: u64) -> u64 {
        match self.plain_size(cipher_len) {
            Ok(s) => s,
            Err(_) => {
                let body = cipher_len.saturating_sub(self.header);
                body / self.cipher_block_size() * self.block
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const L: Layout = Layout::new(4096, 28);

    #[test]
    fn known_sizes() {
        assert_eq!(L.cipher_size(0), 0);
        assert_eq!(L.cipher_size(1), 18 + 1 + 28);
        assert_eq!(L.cipher_size(4096), 18 + 4124);
        assert_eq!(L.cipher_size(4097), 18 + 4124 + 29);
        assert_eq!(L.plain_size(18), Ok(0));
        assert_eq!(L.plain_size(17), Err(LayoutError::TruncatedHeader));
        assert_eq!(L.plain_size(18 + 28), Err(LayoutError::TruncatedBlock));
        assert_eq!(L.plain_size_lenient(18 + 4124 + 5), 4096);
        let shared = L.with_header_len(4096);
        assert_eq!(shared.cipher_size(1), 4096 + 1 + 28);
        assert_eq!(shared.plain_size(4096), Ok(0));
        assert_eq!(shared.plain_size(4095), Err(LayoutError::TruncatedHeader));
        assert_eq!(shared.cipher_offset(1), 4096 + 4124);
    }

    #[test]
    fn without_a_header_or_overhead_sizes_are_the_identity() {
        let xts = Layout::with_header(4096, 0, 0);
        for size in [
            0u64,
            1,
            15,
            16,
            17,
            4095,
            4096,
            4097,
            4111,
            4112,
            (1 << 20) + 5,
        ] {
            assert_eq!(xts.cipher_size(size), size);
            assert_eq!(xts.plain_size(size), Ok(size));
            assert_eq!(
                xts.cipher_offset(xts.span(size, 1).first),
                size / 4096 * 4096
            );
        }
    }

    proptest! {
        #[test]
        fn sizes_round_trip(size in 0u64..(1 << 40)) {
            prop_assert_eq!(L.plain_size(L.cipher_size(size)), Ok(size));
        }

        #[test]
        fn span_covers_range(off in 0u64..(1 << 30), len in 1u64..(1 << 22)) {
            let s = L.span(off, len);
            prop_assert!(L.plain_offset(s.first) <= off);
            prop_assert!(L.plain_offset(s.first + s.count) >= off + len);
            prop_assert!(L.plain_offset(s.first + s.count - 1) < off + len);
        }

        #[test]
        fn block_lens_sum_to_size(size in 0u64..(1 << 24)) {
            let total: u64 = (0..L.block_count(size)).map(|n| L.block_len(n, size)).sum();
            prop_assert_eq!(total, size);
        }
    }
}
