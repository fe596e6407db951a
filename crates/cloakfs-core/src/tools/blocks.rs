//! Verified sequential reading of a whole backing file, block by block, for the offline tools
//! (cat, fsck, export, rekey).
//!
//! Unlike [`crate::io::file::ContentFile`], which fails a whole read when one block in it fails,
//! [`BlockReader::read_chunk`] opens every block of a chunk (in parallel for large chunks) and
//! reports each failed block by number, so a tool can print everything before the first bad
//! block (cat), list every bad block (fsck) or keep holes as holes (rekey). The plaintext of a
//! failed block is never handed out: its bytes in the output are zero.

use crate::error::{Error, Result};
use crate::format::content::{ContentCodec, FileCipher, FileId};
use crate::format::layout::{Layout, LayoutError};
use rayon::prelude::*;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Blocks per chunk that tools read at once (1 MiB of plaintext with 4 KiB blocks).
pub const CHUNK_BLOCKS: u64 = 256;
/// Chunks of at least this many blocks are opened on all cores.
const PARALLEL_MIN: usize = 16;

/// What happened to one block of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// Authenticated and decrypted.
    Data,
    /// A hole: an all-zero full block on a sparse volume (reads as zeros, no key involved).
    Hole,
    /// Failed authentication (tampered, or sealed under another key or file ID).
    Failed,
}

/// A chunk of consecutive blocks as read by [`BlockReader::read_chunk`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Number of the first block.
    pub first: u64,
    /// The state of each block, in order.
    pub states: Vec<BlockState>,
}

impl Chunk {
    /// The first block that failed, if any.
    pub fn first_failure(&self) -> Option<u64> {
        self.states
            .iter()
            .position(|s| *s == BlockState::Failed)
            .map(|i| self.first + i as u64)
    }

    /// Every block that failed.
    pub fn failures(&self) -> impl Iterator<Item = u64> + '_ {
        self.states
            .iter()
            .enumerate()
            .filter(|(_, s)| **s == BlockState::Failed)
            .map(|(i, _)| self.first + i as u64)
    }
}

/// Reads one backing file's plaintext block by block.
pub struct BlockReader {
    file: File,
    cipher: Option<FileCipher>,
    layout: Layout,
    strict_holes: bool,
    size: u64,
    backing_len: u64,
    damage: Option<LayoutError>,
}

impl std::fmt::Debug for BlockReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockReader")
            .field("size", &self.size)
            .field("backing_len", &self.backing_len)
            .finish_non_exhaustive()
    }
}

impl BlockReader {
    /// Reads the header of `file`. Fails on a truncated header and on an unknown header
    /// version; a damaged tail (cut inside the last block) is reported by
    /// [`BlockReader::damage`] and the blocks before it stay readable.
    pub fn open(codec: &ContentCodec, file: File) -> Result<Self> {
        let layout = codec.layout();
        let backing_len = file.metadata()?.len();
        let damage = layout.plain_size(backing_len).err();
        if damage == Some(LayoutError::TruncatedHeader) {
            return Err(Error::Tampered(format!(
                "file header truncated ({backing_len} of {} bytes)",
                layout.header_len()
            )));
        }
        let cipher = crate::io::header::read(codec, &file, backing_len)?
            .map(|h| codec.open_header(&h).map(|o| o.cipher))
            .transpose()?;
        Ok(Self {
            file,
            cipher,
            layout,
            strict_holes: codec.strict_holes(),
            size: layout.plain_size_lenient(backing_len),
            backing_len,
            damage,
        })
    }

    /// Plaintext size of the readable part (whole blocks only if the tail is damaged).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Length of the backing file.
    pub fn backing_len(&self) -> u64 {
        self.backing_len
    }

    /// The file ID from the header (`None` for an empty backing file).
    pub fn file_id(&self) -> Option<FileId> {
        self.cipher.as_ref().map(FileCipher::id)
    }

    /// Block geometry.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Number of readable blocks.
    pub fn block_count(&self) -> u64 {
        self.layout.block_count(self.size)
    }

    /// Why the backing length is not a valid file length (the last block is cut), if it is not.
    pub fn damage(&self) -> Option<String> {
        self.damage.map(|_| {
            format!(
                "backing file length {} is not a valid length: its last block is cut short",
                self.backing_len
            )
        })
    }

    /// The backing file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Decrypts up to `max_blocks` blocks from block `first` into `out` (resized to their
    /// plaintext length) and reports the state of each. `sealed` is scratch space (it receives
    /// the backing bytes of the chunk, which rekey reuses to keep holes). Failed blocks are
    /// zero in `out`.
    pub fn read_chunk(
        &self,
        first: u64,
        max_blocks: u64,
        out: &mut Vec<u8>,
        sealed: &mut Vec<u8>,
    ) -> Result<Chunk> {
        let count = self.block_count().saturating_sub(first).min(max_blocks);
        let l = self.layout;
        if count == 0 {
            out.clear();
            sealed.clear();
            return Ok(Chunk {
                first,
                states: Vec::new(),
            });
        }
        let cipher = self
            .cipher
            .as_ref()
            .expect("a file with blocks has a header");
        let p0 = l.plain_offset(first);
        let p1 = l.plain_offset(first + count).min(self.size);
        let c0 = l.cipher_offset(first);
        let c1 = l.cipher_size(p1).max(c0);
        out.clear();
        out.resize((p1 - p0) as usize, 0);
        sealed.clear();
        sealed.resize((c1 - c0) as usize, 0);
        self.file.read_exact_at(sealed, c0).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Error::Tampered("backing file changed while it was read".into())
            } else {
                e.into()
            }
        })?;
        let bs = l.block_size() as usize;
        let cbs = l.cipher_block_size() as usize;
        let strict = self.strict_holes;
        let open = |(i, (s, o)): (usize, (&[u8], &mut [u8]))| -> BlockState {
            let b = first + i as u64;
            let hole = !strict && s.len() == cbs && s.iter().all(|&x| x == 0);
            match cipher.open(b, s, o) {
                Ok(()) if hole => BlockState::Hole,
                Ok(()) => BlockState::Data,
                Err(_) => {
                    o.fill(0);
                    BlockState::Failed
                }
            }
        };
        let states: Vec<BlockState> = if count as usize >= PARALLEL_MIN {
            sealed
                .par_chunks(cbs)
                .zip(out.par_chunks_mut(bs))
                .enumerate()
                .map(open)
                .collect()
        } else {
            sealed
                .chunks(cbs)
                .zip(out.chunks_mut(bs))
                .enumerate()
                .map(open)
                .collect()
        };
        debug_assert_eq!(states.len() as u64, count);
        Ok(Chunk { first, states })
    }

    /// The sealed bytes of block `b` inside a chunk's `sealed` scratch buffer.
    pub fn sealed_block<'a>(&self, chunk: &Chunk, sealed: &'a [u8], b: u64) -> &'a [u8] {
        let cbs = self.layout.cipher_block_size() as usize;
        let start = (b - chunk.first) as usize * cbs;
        &sealed[start..(start + cbs).min(sealed.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::secret::SecretBytes;
    use crate::format::content::ContentSuite;
    use crate::io::file::ContentFile;
    use std::sync::Arc;

    fn codec(strict: bool) -> Arc<ContentCodec> {
        Arc::new(ContentCodec::new(
            ContentSuite::Aes256Gcm,
            4096,
            strict,
            SecretBytes::from_slice(&[4; 32]),
        ))
    }

    fn make(data: &[u8], hole_at: Option<u64>) -> tempfile::NamedTempFile {
        let t = tempfile::NamedTempFile::new().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(t.path())
            .unwrap();
        let cf = ContentFile::open(codec(false), f).unwrap();
        cf.write_at(0, data).unwrap();
        if let Some(off) = hole_at {
            cf.punch_hole(off, 4096).unwrap();
        }
        t
    }

    fn read_all(r: &BlockReader) -> (Vec<u8>, Vec<BlockState>) {
        let (mut all, mut states) = (Vec::new(), Vec::new());
        let (mut out, mut sealed) = (Vec::new(), Vec::new());
        let mut b = 0;
        while b < r.block_count() {
            let c = r.read_chunk(b, 7, &mut out, &mut sealed).unwrap();
            all.extend_from_slice(&out);
            b += c.states.len() as u64;
            states.extend(c.states);
        }
        (all, states)
    }

    #[test]
    fn reads_everything_and_names_bad_blocks() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let t = make(&data, Some(8192));
        let r = BlockReader::open(&codec(false), File::open(t.path()).unwrap()).unwrap();
        assert_eq!(r.size(), 100_000);
        let (all, states) = read_all(&r);
        let mut want = data.clone();
        want[8192..12288].fill(0);
        assert_eq!(all, want);
        assert_eq!(states[2], BlockState::Hole);
        assert_eq!(
            states.iter().filter(|s| **s == BlockState::Data).count(),
            24
        );

        // Flip a byte in block 5: only block 5 fails, its bytes are zero.
        crate::io::file::tests::flip_byte(t.path(), 18 + 5 * 4124 + 100);
        let r = BlockReader::open(&codec(false), File::open(t.path()).unwrap()).unwrap();
        let (all, states) = read_all(&r);
        assert_eq!(states[5], BlockState::Failed);
        assert!(all[5 * 4096..6 * 4096].iter().all(|&b| b == 0));
        let mut out = Vec::new();
        let mut sealed = Vec::new();
        let c = r.read_chunk(0, 256, &mut out, &mut sealed).unwrap();
        assert_eq!(c.first_failure(), Some(5));
        assert_eq!(c.failures().collect::<Vec<_>>(), vec![5]);
        // A strict reader refuses the hole.
        let r = BlockReader::open(&codec(true), File::open(t.path()).unwrap()).unwrap();
        let (_, states) = read_all(&r);
        assert_eq!(states[2], BlockState::Failed);
    }

    #[test]
    fn damaged_lengths() {
        let t = make(&[1u8; 5000], None);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(t.path())
            .unwrap();
        f.set_len(18 + 4124 + 10).unwrap();
        let r = BlockReader::open(&codec(false), File::open(t.path()).unwrap()).unwrap();
        assert!(r.damage().is_some());
        assert_eq!(r.size(), 4096);
        assert_eq!(read_all(&r).0, vec![1u8; 4096]);
        f.set_len(10).unwrap();
        assert!(BlockReader::open(&codec(false), File::open(t.path()).unwrap()).is_err());
        f.set_len(0).unwrap();
        let r = BlockReader::open(&codec(false), File::open(t.path()).unwrap()).unwrap();
        assert_eq!((r.size(), r.block_count(), r.file_id()), (0, 0, None));
    }
}
