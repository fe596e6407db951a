//! Changes of size and of backing space: truncate, punching holes, reserving space
//! (fallocate). Growing leaves holes (encrypted zeros on a strict volume); shrinking seals
//! the new partial last block again, under the file's own ID. A truncate that cannot grow
//! the file leaves it as it was; one that cannot shrink it for want of space leaves a
//! consistent file (see [`ContentFile::room_for_last_block`]).

use super::write::tail_mark;
use super::{fallocate, may_have_holes, ContentFile, State, PLAIN};
use crate::error::Result;
use std::os::unix::fs::{FileExt, MetadataExt};

impl ContentFile {
    /// Sets the plaintext size: shrinking re-seals a new partial last block, growing leaves a
    /// hole (or encrypted zeros on a strict volume).
    pub fn truncate(&self, new_size: u64) -> Result<()> {
        let (_hold, mut st) = self.changing()?;
        let old = st.size;
        if new_size == old {
            return Ok(());
        }
        if new_size == 0 && self.sharing.is_shared() && st.cipher.is_some() {
            // Shared: the header stays (a header-only file), so that other clients writing
            // the emptied file at once keep sealing under the one header it has (FORMAT.md
            // 19). A suite that keeps it in an xattr has no header bytes to keep.
            self.file.set_len(self.layout().header_len())?;
            st.size = 0;
            st.holes = false;
            st.loaded = true;
            return Ok(());
        }
        if new_size == 0 {
            self.file.set_len(0)?;
            st.cipher = None;
            st.id_owned = false;
            st.size = 0;
            st.holes = false;
            st.loaded = true;
            return Ok(());
        }
        if new_size > old {
            // Growing rewrites the partial last block before the backing file is lengthened,
            // which the backing file system may refuse (EFBIG past its largest file, ENOSPC):
            // then the old block and length go back, or the file would keep a block sealed
            // for a size it does not have.
            let old_end = self.old_end(&st)?;
            return self
                .ensure_header(&mut st)
                .and_then(|()| self.extend(&mut st, new_size, false).map(drop))
                .inspect_err(|_| self.put_back(&mut st, old_end));
        }
        let layout = self.layout();
        let rem = (new_size % layout.block_size()) as usize;
        if rem != 0 {
            // The new last block is sealed: under the file's own ID.
            self.ensure_header(&mut st)?;
            let b = new_size / layout.block_size();
            self.room_for_last_block(&mut st, b, rem)?;
            let cipher = st.cipher.as_ref().expect("non-empty file has a header");
            let old_len = layout.block_len(b, old) as usize;
            let tail = tail_mark(&st);
            PLAIN
                .with_borrow_mut(|plain| -> Result<()> {
                    plain.resize(old_len, 0);
                    self.read_block(cipher, b, old_len, plain)?;
                    let mut sealed = vec![0u8; rem + layout.overhead() as usize];
                    self.fresh_tail(cipher, rem)?;
                    cipher.seal(b, &plain[..rem], &mut sealed);
                    self.file.write_all_at(&sealed, layout.cipher_offset(b))?;
                    Ok(())
                })
                .inspect_err(|_| self.put_back_tail(&st, tail))?;
        }
        self.file.set_len(layout.cipher_size(new_size))?;
        st.size = new_size;
        Ok(())
    }

    /// Before a shrinking truncate seals block `b` as the last one, `rem` plaintext bytes long,
    /// over its old backing range: that range may lie partly in a hole of the backing file
    /// (block `b` was a hole), and on a full disk the write would stop short and leave a block
    /// that fails authentication. So its space is reserved first; if the disk is full, the
    /// blocks past `b` (past the new size anyway) are cut off first, which frees what they
    /// held and leaves a consistent file whose last block is `b` whole, and the space is
    /// asked for again. If even that fails, the truncate fails with the file at that size.
    fn room_for_last_block(&self, st: &mut State, b: u64, rem: usize) -> Result<()> {
        let layout = self.layout();
        let at = layout.cipher_offset(b);
        let end = at + rem as u64 + layout.overhead();
        match self.reserve(at, end) {
            Err(e) if e.errno() == libc::ENOSPC => {
                let whole_b = ((b + 1) * layout.block_size()).min(st.size);
                if whole_b < st.size {
                    self.file.set_len(layout.cipher_size(whole_b))?;
                    st.size = whole_b;
                }
                self.reserve(at, end)
            }
            r => r,
        }
    }

    /// Zeroes `len` bytes at `off` without changing the size (FALLOC_FL_PUNCH_HOLE). Whole
    /// blocks become holes in the backing file on sparse volumes.
    pub fn punch_hole(&self, off: u64, len: u64) -> Result<()> {
        let size = self.changing()?.1.size;
        let end = (off + len).min(size);
        if off >= end {
            return Ok(());
        }
        let layout = self.layout();
        let bs = layout.block_size();
        // Whole blocks strictly inside the range, excluding a partial last block of the file.
        let first_full = off.div_ceil(bs);
        let last_full = end / bs; // exclusive
        if self.codec.strict_holes() || first_full >= last_full {
            return self.write_zeros(off, end - off);
        }
        let head_end = first_full * bs;
        if off < head_end {
            self.write_zeros(off, head_end - off)?;
        }
        let tail_start = last_full * bs;
        if tail_start < end {
            self.write_zeros(tail_start, end - tail_start)?;
        }
        let (_hold, mut st) = self.changing()?;
        st.holes = true;
        let c0 = layout.cipher_offset(first_full);
        let c1 = layout.cipher_offset(last_full);
        fallocate(
            &self.file,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            c0,
            c1 - c0,
        )
        .or_else(|e| {
            // Without hole punching in the backing file system, write zeros ourselves.
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
            ) {
                let zeros = vec![0u8; (c1 - c0).min(1 << 20) as usize];
                let mut pos = c0;
                while pos < c1 {
                    let n = (c1 - pos).min(zeros.len() as u64) as usize;
                    self.file.write_all_at(&zeros[..n], pos)?;
                    pos += n as u64;
                }
                Ok(())
            } else {
                Err(e)
            }
        })?;
        Ok(())
    }

    /// Reserves backing space for `len` bytes at `off` (fallocate mode 0 or KEEP_SIZE).
    pub fn allocate(&self, off: u64, len: u64, keep_size: bool) -> Result<()> {
        let end = off + len;
        if !keep_size && end > self.size() {
            self.truncate(end)?;
        }
        let layout = self.layout();
        let span = layout.span(off, len);
        let c0 = layout.cipher_offset(span.first);
        let c1 = layout.cipher_offset(span.first + span.count);
        match fallocate(&self.file, libc::FALLOC_FL_KEEP_SIZE, c0, c1 - c0) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            Err(e) => Err(e.into()),
            Ok(()) => {
                // The range growing the file made holes of is now allocated: writes to the
                // file no longer need reserving, unless holes remain elsewhere.
                let (_hold, mut st) = self.changing()?;
                let meta = self.file.metadata()?;
                st.holes = may_have_holes(meta.len(), meta.blocks());
                Ok(())
            }
        }
    }

    fn write_zeros(&self, off: u64, len: u64) -> Result<()> {
        let chunk = vec![0u8; len.min(1 << 20) as usize];
        let mut pos = off;
        while pos < off + len {
            let n = (off + len - pos).min(chunk.len() as u64) as usize;
            self.write_at(pos, &chunk[..n])?;
            pos += n as u64;
        }
        Ok(())
    }
}
