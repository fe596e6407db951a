//! Writes: plaintext sealed into blocks at any offset, and the file grown to reach it.
//!
//! Blocks a write covers whole are sealed from the caller's bytes directly (on rayon's pool
//! from [`PARALLEL_MIN_BLOCKS`] blocks); edge blocks that keep old bytes are read, opened and
//! sealed again. A write that fails (a full disk) leaves the plaintext as it was: its space
//! is reserved first, or the old end ([`OldEnd`]) goes back (see [`ContentFile::write_at`]).
//! A short last block of AES-256-XTS is sealed under a counter block of its own, stored in
//! the header first ([`ContentFile::fresh_tail`]). On a store without locks, sealed bytes go
//! out in pieces of whole blocks ([`ContentFile::write_sealed`]).

use super::{fallocate, ContentFile, State, PARALLEL_MIN_BLOCKS, PLAIN, SEALED};
use crate::error::{Error, Result};
use crate::format::content::{FileCipher, FreshNonce, TailMark};
use crate::io::header;
use crate::io::lease::LeaseGuard;
use rayon::prelude::*;
use std::os::unix::fs::FileExt;
use std::sync::RwLockWriteGuard;

/// Most blocks sealed per write syscall when filling a strict volume's gaps with zeros.
const ZERO_FILL_BATCH: u64 = 256;

/// The end of a file before a write at or past it: the plaintext size, if the last block is
/// partial, its sealed bytes and their offset, and what they were sealed under.
pub(super) struct OldEnd {
    size: u64,
    partial: Option<(u64, Vec<u8>)>,
    tail: Option<TailMark>,
    /// Whether the file had its header before the write.
    header: bool,
}

/// A block's sealed bytes as the caller already read them (index, bytes), so that a write
/// that keeps part of it opens them instead of reading them again.
type SealedBlock<'a> = Option<(u64, &'a [u8])>;

impl OldEnd {
    /// The partial last block, sealed, if there is one.
    fn last_block(&self, bs: u64) -> SealedBlock<'_> {
        self.partial
            .as_ref()
            .map(|(_, sealed)| (self.size / bs, sealed.as_slice()))
    }
}

/// Most bytes written to the backing file in one system call on a store without locks (see
/// [`ContentFile::write_sealed`]).
const UNLOCKED_WRITE_MAX: usize = 32 * 1024;

impl ContentFile {
    /// Writes `data` at plaintext offset `off` (filling any gap with a hole); returns its length.
    ///
    /// A failed write leaves the plaintext as it was: a write that starts before the old
    /// partial last block first reserves the space it may need, and any other write, which
    /// can only change that block, puts the block and the old length back. The latter spares
    /// a growing file the reservation, which makes ext4 allocate at once instead of at
    /// writeback; appends through the kernel's page cache start there (at the page holding
    /// the old end), so they take this path too.
    pub fn write_at(&self, off: u64, data: &[u8]) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        self.again_if_torn(|| {
            let (hold, st) = self.changing()?;
            self.write_held(hold, st, off, data)
        })?;
        Ok(data.len())
    }

    /// Writes `data` at the end of the file (an `O_APPEND` write); returns the plaintext
    /// offset it was written at. The end is the one the state holds under the file's lease
    /// (shared: read again from the store when the lease is taken, and unchanged by other
    /// clients while it is held), not the size the caller last saw, so appends of any number
    /// of clients land one after another, none over another's (see [`Self::write_at`] for a
    /// failed write).
    pub fn append(&self, data: &[u8]) -> Result<u64> {
        if data.is_empty() {
            return Ok(self.size());
        }
        self.again_if_torn(|| {
            let (hold, st) = self.changing()?;
            let off = st.size;
            self.write_held(hold, st, off, data).map(|()| off)
        })
    }

    /// [`Self::write_at`] of non-empty `data` under `hold` and `st` (from `changing`), which
    /// it lets go of before writing out a finished batch.
    fn write_held(
        &self,
        hold: Option<LeaseGuard<'_>>,
        mut st: RwLockWriteGuard<'_, State>,
        off: u64,
        data: &[u8],
    ) -> Result<()> {
        let bs = self.layout().block_size();
        let before = st.size;
        // Unlocked shared store: a block found failing authentication (another client's
        // write at the same time) fails the write before anything is written; putting back
        // the end this client saw would cut off what the other client wrote.
        let put_back = |e: &Error| !(self.sharing.unlocked() && matches!(e, Error::Tampered(_)));
        let end = if off >= st.size - st.size % bs {
            let old = self.old_end(&st)?;
            self.write_locked(&mut st, off, data, false, old.last_block(bs))
                .inspect_err(|e| {
                    if put_back(e) {
                        self.put_back(&mut st, old)
                    }
                })?
        } else {
            let tail = tail_mark(&st);
            self.write_locked(&mut st, off, data, true, None)
                .inspect_err(|e| {
                    if put_back(e) {
                        self.put_back_tail(&st, tail)
                    }
                })?
        };
        if self.sharing.unlocked() {
            let last = (off + data.len() as u64 - 1) / bs;
            if let Err(e) = self.mend_after_write(&st, off / bs, last, before) {
                tracing::warn!("mending blocks after a write: {e}");
            }
        }
        let finished = st.written.add(end.0, end.1);
        drop((hold, st));
        if let Some(batch) = finished {
            batch.write_out(&self.file);
        }
        Ok(())
    }

    /// What a write from the partial last block on may change, to put back if it fails.
    pub(super) fn old_end(&self, st: &State) -> Result<OldEnd> {
        let layout = self.layout();
        let bs = layout.block_size();
        let partial = if st.size % bs != 0 {
            let b = st.size / bs;
            let c = layout.cipher_offset(b);
            let mut sealed = vec![0u8; (layout.cipher_size(st.size) - c) as usize];
            self.read_sealed(b, &mut sealed, c)?;
            Some((c, sealed))
        } else {
            None
        };
        Ok(OldEnd {
            size: st.size,
            partial,
            tail: tail_mark(st),
            header: st.cipher.is_some(),
        })
    }

    /// Undoes a failed write at or past the end. Putting back the partial block rewrites
    /// bytes that already have their space, and cutting the file needs none.
    pub(super) fn put_back(&self, st: &mut State, old: OldEnd) {
        if let Some((c, sealed)) = old.partial {
            if let Err(e) = self.file.write_all_at(&sealed, c) {
                tracing::warn!("putting back a partial block after a failed write: {e}");
            }
        }
        let mut len = self.layout().cipher_size(old.size);
        if old.header && self.sharing.is_shared() {
            // Shared, a header on the store stays (see `new_header`).
            len = len.max(self.layout().header_len());
        }
        if let Err(e) = self.file.set_len(len) {
            tracing::warn!("cutting a file back after a failed write: {e}");
        }
        st.size = old.size;
        self.put_back_tail(st, old.tail);
    }

    /// Before a block of `len` bytes is sealed as the file's last: a short block of
    /// AES-256-XTS gets a counter block of its own, stored in the header first (see
    /// [`FileCipher::fresh_tail`]).
    pub(super) fn fresh_tail(&self, cipher: &FileCipher, len: usize) -> Result<()> {
        match cipher.fresh_tail(len) {
            Some(header) => header::rewrite(&self.codec, &self.file, &header),
            None => Ok(()),
        }
    }

    /// After a failed write: the counter block the old last block is sealed under, back in the
    /// header (see [`FileCipher::put_back_tail`]).
    pub(super) fn put_back_tail(&self, st: &State, mark: Option<TailMark>) {
        let header = mark.and_then(|m| st.cipher.as_ref()?.put_back_tail(m));
        if let Some(header) = header {
            if let Err(e) = header::rewrite(&self.codec, &self.file, &header) {
                tracing::warn!("putting back a file header after a failed write: {e}");
            }
        }
    }

    /// Seals and writes `data` at `off`; returns the backing range written. `reserve` asks
    /// for the space to be reserved first; `known` is a block the caller has read already.
    fn write_locked(
        &self,
        st: &mut State,
        off: u64,
        data: &[u8],
        reserve: bool,
        known: SealedBlock<'_>,
    ) -> Result<(u64, u64)> {
        let layout = self.layout();
        let span = layout.span(off, data.len() as u64);
        // A fresh header comes with the nonces of the blocks below (one getrandom(2)).
        let (mut header, drawn) = match self.new_header(st, span.count as usize)? {
            Some((h, nonces)) => (Some(h), Some(nonces)),
            None => (None, None),
        };
        if off > st.size || st.size > 0 {
            if let Some(h) = header.take() {
                self.put_header(st, &h)?;
            }
        }
        // Extending re-seals the old last block: what the caller read of it is stale then.
        let zero_tail;
        let known = if off > st.size {
            zero_tail = self.extend(st, off, true)?;
            zero_tail
                .as_ref()
                .map(|(b, sealed)| (*b, sealed.as_slice()))
        } else {
            known
        };
        let bs = layout.block_size();
        let end = off + data.len() as u64;
        let old_size = st.size;
        let new_size = old_size.max(end);
        let cipher = st.cipher.as_ref().expect("header ensured");
        let c_start = layout.cipher_offset(span.first);
        let c_end = layout
            .cipher_offset(span.first + span.count)
            .min(layout.cipher_size(new_size));
        let overhead = layout.overhead() as usize;

        // A new file's header goes out with its first blocks (then c_start is the header
        // length).
        let prefix = header.as_ref().map_or(0, Vec::len);
        debug_assert!(header.is_none() || c_start == layout.header_len());
        SEALED.with_borrow_mut(|buf| -> Result<()> {
            buf.resize(prefix + (c_end - c_start) as usize, 0);
            let (head, out) = buf.split_at_mut(prefix);
            if let Some(h) = &header {
                head.copy_from_slice(h);
            }
            // One getrandom(2) for the nonces of every block of the request.
            let mut nonces = drawn
                .unwrap_or_else(|| cipher.fresh_nonces(span.count as usize))
                .into_iter();
            // Edge blocks that keep old bytes need read-modify-write; the rest is sealed from
            // `data` directly.
            let mut direct = Vec::with_capacity(span.count as usize);
            let mut rest_out: &mut [u8] = out;
            for b in span.first..span.first + span.count {
                let b_off = layout.plain_offset(b);
                let old_len = layout.block_len(b, old_size) as usize;
                let new_len = layout.block_len(b, new_size) as usize;
                let ws = (off.max(b_off) - b_off) as usize;
                let we = (end.min(b_off + bs) - b_off) as usize;
                let (dst, tail) = std::mem::take(&mut rest_out).split_at_mut(new_len + overhead);
                rest_out = tail;
                let src =
                    &data[(b_off + ws as u64 - off) as usize..(b_off + we as u64 - off) as usize];
                let nonce = nonces.next().expect("one nonce per block");
                if old_len > 0 && (ws > 0 || we < old_len) {
                    PLAIN.with_borrow_mut(|plain| -> Result<()> {
                        plain.resize(new_len, 0);
                        match known.filter(|&(k, _)| k == b) {
                            Some((_, sealed)) => cipher.open(b, sealed, &mut plain[..old_len])?,
                            None => self.read_block(cipher, b, old_len, &mut plain[..old_len])?,
                        }
                        plain[ws..we].copy_from_slice(src);
                        self.fresh_tail(cipher, new_len)?;
                        cipher.seal_fresh(b, nonce, &plain[..new_len], dst);
                        Ok(())
                    })?;
                } else {
                    debug_assert_eq!(ws, 0);
                    debug_assert_eq!(we, new_len);
                    self.fresh_tail(cipher, new_len)?;
                    direct.push((b, nonce, src, dst));
                }
            }
            let seal = |(b, nonce, src, dst): (u64, FreshNonce, &[u8], &mut [u8])| {
                cipher.seal_fresh(b, nonce, src, dst)
            };
            if direct.len() as u64 >= PARALLEL_MIN_BLOCKS {
                direct.into_par_iter().for_each(seal);
            } else {
                direct.into_iter().for_each(seal);
            }
            // 0 for a new file, whose header goes out with its blocks.
            let old_end = layout.cipher_size(old_size);
            let at = c_start - prefix as u64;
            if reserve {
                // Overwritten blocks already have their space, unless they lie in a hole.
                self.reserve(if st.holes { at } else { old_end }, c_end)?;
            }
            self.write_sealed(buf, at, prefix)?;
            Ok(())
        })?;
        st.size = new_size;
        Ok((c_start - prefix as u64, c_end))
    }

    /// Grows the file from `st.size` to `new_size` with zeros. The header must exist.
    /// `written`: a write at `new_size` follows, which lengthens the backing file itself; then,
    /// shared, whole blocks of holes are not made by setting the length, which would cut off
    /// what another client wrote further on meanwhile, and on a store without locks (SFTP) a
    /// new partial last block of zeros is not written but returned (its index and sealed
    /// bytes), for the write to fill: written first, it would land over whatever another
    /// client wrote there meanwhile.
    pub(super) fn extend(
        &self,
        st: &mut State,
        new_size: u64,
        written: bool,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        let layout = self.layout();
        let bs = layout.block_size();
        let overhead = layout.overhead() as usize;
        let cipher = st.cipher.as_ref().expect("header ensured");
        let mut size = st.size;
        // Complete the old partial last block.
        if size % bs != 0 {
            let b = size / bs;
            let old_len = (size % bs) as usize;
            let new_len = layout.block_len(b, new_size) as usize;
            PLAIN.with_borrow_mut(|plain| -> Result<()> {
                plain.clear();
                plain.resize(new_len, 0);
                self.read_block(cipher, b, old_len, &mut plain[..old_len])?;
                let mut sealed = vec![0u8; new_len + overhead];
                self.fresh_tail(cipher, new_len)?;
                cipher.seal(b, plain, &mut sealed);
                let c = layout.cipher_offset(b);
                self.reserve(layout.cipher_size(size), c + sealed.len() as u64)?;
                self.file.write_all_at(&sealed, c)?;
                Ok(())
            })?;
            size = layout.plain_offset(b) + new_len as u64;
        }
        if size < new_size {
            if self.codec.strict_holes() {
                let zeros = vec![0u8; bs as usize];
                let mut b = size / bs;
                let last = (new_size - 1) / bs;
                while b <= last {
                    let n = (last - b + 1).min(ZERO_FILL_BATCH);
                    let mut sealed = Vec::with_capacity((n * layout.cipher_block_size()) as usize);
                    let nonces = cipher.fresh_nonces(n as usize);
                    for (i, nonce) in (b..b + n).zip(nonces) {
                        let l = layout.block_len(i, new_size) as usize;
                        let start = sealed.len();
                        sealed.resize(start + l + overhead, 0);
                        self.fresh_tail(cipher, l)?;
                        cipher.seal_fresh(i, nonce, &zeros[..l], &mut sealed[start..]);
                    }
                    let c = layout.cipher_offset(b);
                    self.reserve(layout.cipher_size(size), c + sealed.len() as u64)?;
                    self.write_sealed(&sealed, c, 0)?;
                    size = layout.plain_offset(b + n).min(new_size);
                    b += n;
                }
            } else {
                st.holes = true;
                let last = (new_size - 1) / bs;
                let tail = layout.block_len(last, new_size) as usize;
                if tail < bs as usize {
                    // A partial last block must authenticate; whole blocks before it are holes.
                    let zeros = vec![0u8; tail];
                    let mut sealed = vec![0u8; tail + overhead];
                    self.fresh_tail(cipher, tail)?;
                    cipher.seal(last, &zeros, &mut sealed);
                    if written && self.sharing.unlocked() {
                        st.size = new_size;
                        return Ok(Some((last, sealed)));
                    }
                    self.file
                        .write_all_at(&sealed, layout.cipher_offset(last))?;
                } else if !(written && self.sharing.is_shared()) {
                    self.file.set_len(layout.cipher_size(new_size))?;
                }
            }
        }
        st.size = new_size;
        Ok(None)
    }

    /// Writes `buf`, sealed blocks after `prefix` header bytes, at backing offset `at`. On a
    /// store without locks, in pieces of whole blocks of at most [`UNLOCKED_WRITE_MAX`] bytes,
    /// which its client sends in one request each (sshfs cuts a write into SFTP requests of
    /// 32 KiB from its start, which would cut blocks in two): another client writing the same
    /// blocks at once then leaves each block whole from one of the writes, never part of each.
    fn write_sealed(&self, buf: &[u8], at: u64, prefix: usize) -> Result<()> {
        if !self.sharing.unlocked() {
            return Ok(self.file.write_all_at(buf, at)?);
        }
        let cbs = self.layout().cipher_block_size() as usize;
        let mut start = 0;
        let mut room = UNLOCKED_WRITE_MAX.saturating_sub(prefix);
        while start < buf.len() {
            let first = start == 0;
            let len = (room / cbs).max(1) * cbs + if first { prefix } else { 0 };
            let end = (start + len).min(buf.len());
            self.file
                .write_all_at(&buf[start..end], at + start as u64)?;
            start = end;
            room = UNLOCKED_WRITE_MAX;
        }
        Ok(())
    }

    /// Reserves `[from, to)` of the backing file before writing past its end.
    pub(super) fn reserve(&self, from: u64, to: u64) -> Result<()> {
        if to <= from {
            return Ok(());
        }
        match fallocate(&self.file, libc::FALLOC_FL_KEEP_SIZE, from, to - from) {
            Ok(()) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// What the file's last block is sealed under, for [`ContentFile::put_back_tail`].
pub(super) fn tail_mark(st: &State) -> Option<TailMark> {
    st.cipher.as_ref().map(FileCipher::tail_mark)
}
