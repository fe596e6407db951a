//! Reads: the sealed blocks holding a range are read into the caller's buffer and opened
//! there, in place (on rayon's pool from [`PARALLEL_MIN_BLOCKS`] blocks). A read returns
//! nothing unless every block it covers opens (authenticates, or is a hole where the volume
//! allows them). A shared file's read that fails its check is read again while no other
//! client changes the file, which may have been rewriting it; on a store without locks, a
//! few more times ([`TORN_READ_RETRIES`]), as changes are ([`ContentFile::again_if_torn`]).

use super::mend::Mend;
use super::{tampered, ContentFile, State, PARALLEL_MIN_BLOCKS, SEALED};
use crate::error::{Error, Result};
use crate::format::content::FileCipher;
use crate::format::layout::Layout;
use crate::io::stream;
use rayon::prelude::*;
use std::ops::Range;
use std::os::unix::fs::FileExt;

/// How many more times a shared file's read that fails authentication under the lock
/// is tried (see [`ContentFile::read_into`]).
const TORN_READ_RETRIES: u64 = 5;

impl ContentFile {
    /// Reads up to `buf.len()` plaintext bytes at `off`; returns the count (0 at end of file).
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<usize> {
        SEALED.with_borrow_mut(|scratch| {
            let got = self.read_into(off, buf.len(), scratch)?;
            buf[..got.len()].copy_from_slice(&scratch[got.clone()]);
            Ok(got.len())
        })
    }

    /// Room [`Self::read_to`] needs for a read of up to `len` bytes (see [`Layout::read_room`]).
    pub fn read_room(&self, len: usize) -> usize {
        self.layout().read_room(len)
    }

    /// [`Self::read_to`] into `buf`, grown to [`Self::read_room`] if shorter.
    pub fn read_into(&self, off: u64, len: usize, buf: &mut Vec<u8>) -> Result<Range<usize>> {
        let room = self.read_room(len);
        if buf.len() < room {
            buf.resize(room, 0);
        }
        self.read_to(off, len, buf)
    }

    /// Reads up to `len` plaintext bytes at `off` into `out` (at least [`Self::read_room`]
    /// bytes) and returns where in `out` they are (an empty range at end of file). The sealed
    /// blocks holding them are read into `out` and opened there, each block's plaintext moving
    /// left over the sealed bytes of the ones before it: one buffer, and no copy.
    pub fn read_to(&self, off: u64, len: usize, out: &mut [u8]) -> Result<Range<usize>> {
        if out.len() < self.read_room(len) {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "read buffer smaller than the blocks it must hold",
            )));
        }
        let read = self.read_in(&*self.loaded_state()?, off, len, out);
        let (got, c_start, c_end) = match read {
            Err(Error::Tampered(_)) if self.sharing.is_shared() => {
                // Another client may have rewritten the file meanwhile: read again while no
                // client changes it. A store without locks (SFTP) lets that client go on, so
                // a block may show half written again: a few more tries, apart. A damaged
                // block fails them all.
                let mut attempt = 0;
                loop {
                    let again = {
                        let mut st = self.write_state();
                        let _quiet = self.quiet()?;
                        self.reload(&mut st)?;
                        if self.sharing.unlocked() {
                            self.mend_span(&st, off, len);
                        }
                        self.read_in(&st, off, len, out)
                    };
                    match again {
                        Err(Error::Tampered(_)) if attempt < TORN_READ_RETRIES => {
                            attempt += 1;
                            std::thread::sleep(std::time::Duration::from_millis(attempt));
                        }
                        r => break r?,
                    }
                }
            }
            r => r?,
        };
        // Small reads never count: they skip the lock that concurrent readers would share.
        if stream::is_stream_request(c_start, c_end) {
            let finished = self
                .read
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .add(c_start, c_end);
            if let Some(batch) = finished {
                batch.evict_before(&self.file);
            }
        }
        Ok(got)
    }

    /// [`Self::read_to`] under `st`; also returns the backing range read.
    fn read_in(
        &self,
        st: &State,
        off: u64,
        len: usize,
        out: &mut [u8],
    ) -> Result<(Range<usize>, u64, u64)> {
        if off >= st.size || len == 0 {
            return Ok((0..0, 0, 0));
        }
        let len = (len as u64).min(st.size - off) as usize;
        let cipher = st
            .cipher
            .as_ref()
            .ok_or_else(|| tampered("file has data but no header".into()))?;
        let layout = self.layout();
        let span = layout.span(off, len as u64);
        let c_start = layout.cipher_offset(span.first);
        let c_end = layout
            .cipher_offset(span.first + span.count)
            .min(layout.cipher_size(st.size));
        let sealed = &mut out[..(c_end - c_start) as usize];
        self.file.read_exact_at(sealed, c_start).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                tampered("backing file shorter than its blocks".into())
            } else {
                e.into()
            }
        })?;
        open_run(cipher, layout, span.first, sealed)?;
        let start = (off - layout.plain_offset(span.first)) as usize;
        Ok((start..start + len, c_start, c_end))
    }

    /// Runs `op`, a change of the file; on a store whose locks do not keep other clients out
    /// (SFTP), again (a few times, 1-5 ms apart, the size and header read again from the
    /// store) while it fails because a block it reads fails authentication: another client
    /// was rewriting it, or had changed the file's size since this client read it.
    pub(super) fn again_if_torn<T>(&self, mut op: impl FnMut() -> Result<T>) -> Result<T> {
        let mut attempt = 0;
        loop {
            match op() {
                Err(Error::Tampered(_))
                    if self.sharing.unlocked() && attempt < TORN_READ_RETRIES =>
                {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(attempt));
                    let mut st = self.write_state();
                    self.sharing.forget_cached(&self.file);
                    self.reload(&mut st)?;
                }
                r => return r,
            }
        }
    }

    /// Reads and opens block `b` holding `len` plaintext bytes into `out`. On a store without
    /// locks, a block that another client's write at the same time left holding a shorter
    /// block is mended first (see [`Self::mend_block`]).
    pub(super) fn read_block(
        &self,
        cipher: &FileCipher,
        b: u64,
        len: usize,
        out: &mut [u8],
    ) -> Result<()> {
        let layout = self.layout();
        let mut sealed = vec![0u8; len + layout.overhead() as usize];
        self.read_sealed(b, &mut sealed, layout.cipher_offset(b))?;
        match cipher.open(b, &sealed, &mut out[..len]) {
            Err(Error::Tampered(_))
                if self.sharing.unlocked()
                    && self.mend_block(cipher, b, len, true)? == Mend::Mended =>
            {
                self.read_sealed(b, &mut sealed, layout.cipher_offset(b))?;
                cipher.open(b, &sealed, &mut out[..len])
            }
            r => r,
        }
    }

    /// Reads the sealed bytes of block `b` at backing offset `at`; a short file is tampering.
    pub(super) fn read_sealed(&self, b: u64, sealed: &mut [u8], at: u64) -> Result<()> {
        self.file.read_exact_at(sealed, at).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                tampered(format!("block {b} truncated"))
            } else {
                e.into()
            }
        })
    }
}

/// Opens, in place, the run of sealed blocks in `buf` that starts with block `first` (all
/// of full size but the last): block `first + i`'s plaintext ends at `i * block_size`.
fn open_run(cipher: &FileCipher, layout: Layout, first: u64, buf: &mut [u8]) -> Result<()> {
    let bs = layout.block_size() as usize;
    let cbs = layout.cipher_block_size() as usize;
    let count = buf.len().div_ceil(cbs);
    if count as u64 >= PARALLEL_MIN_BLOCKS {
        // Each block opens within its own sealed bytes on the pool; then they close up.
        buf.par_chunks_mut(cbs)
            .enumerate()
            .try_for_each(|(i, sealed)| {
                cipher.open_within(first + i as u64, sealed, 0).map(drop)
            })?;
        let overhead = layout.overhead() as usize;
        for i in 1..count {
            let s = i * cbs;
            let len = (buf.len() - s).min(cbs) - overhead;
            buf.copy_within(s..s + len, i * bs);
        }
    } else {
        // In order: each block's plaintext lands over the sealed bytes of blocks already open.
        for i in 0..count {
            let end = ((i + 1) * cbs).min(buf.len());
            cipher.open_within(first + i as u64, &mut buf[i * bs..end], i * (cbs - bs))?;
        }
    }
    Ok(())
}
