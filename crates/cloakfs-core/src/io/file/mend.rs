//! Mending the blocks that clients writing one file at once without locks (SFTP) can leave
//! failing authentication: a shorter block sealed at the block's start, then another write's
//! bytes or zeros (FORMAT.md 19). Such a block is sealed again as the shorter block's bytes
//! followed by zeros; a block that fails authentication any other way is left as it is, for
//! readers to refuse.

use super::{tampered, ContentFile, State};
use crate::error::Result;
use crate::format::content::FileCipher;
use std::os::unix::fs::FileExt;

/// What [`ContentFile::mend_block`] found of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mend {
    /// It authenticates (or is a hole).
    Sound,
    /// It held a shorter block sealed at its start: mended (or, asked only, mendable).
    Mended,
    /// It fails authentication otherwise.
    Damaged,
}

/// Most blocks between the end a client saw and its write that it checks after the write
/// (see [`ContentFile::mend_after_write`]).
const MEND_GAP_BLOCKS: u64 = 16;

impl ContentFile {
    /// Unlocked shared store (SFTP), after a write of blocks `first..=last` of a file this
    /// client saw `before` bytes long: mends the blocks that another client's write at the
    /// same time can leave failing authentication, where each client sealed a block for the
    /// file's end as it saw it (FORMAT.md 19). They are this write's last block if it was
    /// sealed short (the file's last) while the file on the store has grown past it, and
    /// the blocks between the end this client saw and the write (holes to it), where another
    /// client may have ended the file meanwhile; at most [`MEND_GAP_BLOCKS`] of those. Each
    /// holds a shorter block sealed at its start and another write's bytes, or zeros, after
    /// it: it is sealed again as that block's bytes followed by zeros (the other write's
    /// bytes in that block are lost, as between writers to one block without locks).
    /// Whichever of the racing clients writes last finds the block to mend: each looks only
    /// after its own write reached the store.
    pub(super) fn mend_after_write(
        &self,
        st: &State,
        first: u64,
        last: u64,
        before: u64,
    ) -> Result<()> {
        if !self.codec.suite().authenticated() {
            return Ok(());
        }
        let layout = self.layout();
        let bs = layout.block_size();
        let gap_start = before.div_ceil(bs);
        let mut blocks: Vec<u64> = (gap_start..first.min(gap_start + MEND_GAP_BLOCKS)).collect();
        let short = st.size % bs != 0 && st.size / bs == last;
        if blocks.is_empty() && !short {
            return Ok(());
        }
        let (len, _) = self.sharing.fresh_size(&self.file)?;
        let store = layout.plain_size_lenient(len);
        if short && store > st.size {
            blocks.push(last);
        }
        let cipher = st
            .cipher
            .as_ref()
            .ok_or_else(|| tampered("file has data but no header".into()))?;
        for b in blocks {
            if b < layout.block_count(store) {
                let want = layout.block_len(b, store) as usize;
                if self.mend_block(cipher, b, want, true)? == Mend::Damaged {
                    // Not what a race leaves: left to the readers, which refuse it.
                    break;
                }
            }
        }
        Ok(())
    }

    /// Whether block `b`, `want` plaintext bytes long, holds, instead of a block that
    /// authenticates, a shorter block sealed at its start followed by other bytes (what
    /// clients writing one file at once without locks can leave, see
    /// [`Self::mend_after_write`]); if so and `write`, it is sealed again at its length as that
    /// block's bytes followed by zeros. Finding the shorter block takes up to one opening per
    /// length (a few ms for a damaged 4 KiB block).
    pub(super) fn mend_block(
        &self,
        cipher: &FileCipher,
        b: u64,
        want: usize,
        write: bool,
    ) -> Result<Mend> {
        let layout = self.layout();
        let overhead = layout.overhead() as usize;
        let at = layout.cipher_offset(b);
        let mut sealed = vec![0u8; want + overhead];
        match self.file.read_exact_at(&mut sealed, at) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Mend::Damaged),
            r => r?,
        }
        let mut plain = vec![0u8; want];
        if cipher.open(b, &sealed, &mut plain).is_ok() {
            return Ok(Mend::Sound);
        }
        let Some(n) = (1..want).rev().find(|&n| {
            cipher
                .open(b, &sealed[..n + overhead], &mut plain[..n])
                .is_ok()
        }) else {
            return Ok(Mend::Damaged);
        };
        if write {
            plain[n..].fill(0);
            cipher.seal(b, &plain, &mut sealed);
            self.file.write_all_at(&sealed, at)?;
        }
        Ok(Mend::Mended)
    }

    /// On a store without locks, after a read of `len` bytes at `off` failed authentication:
    /// mends the blocks it covers that another client's write at the same time left holding
    /// a shorter block (see [`Self::mend_block`]), where this client may write the file.
    pub(super) fn mend_span(&self, st: &State, off: u64, len: usize) {
        let Some(cipher) = st.cipher.as_ref() else {
            return;
        };
        if off >= st.size || !self.codec.suite().authenticated() {
            return;
        }
        let layout = self.layout();
        let span = layout.span(off, (len as u64).min(st.size - off));
        for b in span.first..span.first + span.count {
            let want = layout.block_len(b, st.size) as usize;
            match self.mend_block(cipher, b, want, true) {
                Ok(Mend::Sound | Mend::Mended) => {}
                // Damaged otherwise: the read fails all the same, without looking further.
                Ok(Mend::Damaged) => return,
                Err(e) => {
                    tracing::debug!("mending block {b} after a read: {e}");
                    return;
                }
            }
        }
    }

    /// Of `blocks` (failing authentication), how many hold a shorter block sealed at their
    /// start, as clients writing the file at once without locks can leave them; with `write`,
    /// those are sealed again as that block's bytes followed by zeros, which makes them
    /// readable (`cloakfs fsck --repair`).
    pub fn mend_blocks(&self, blocks: &[u64], write: bool) -> Result<usize> {
        let st = self.loaded_state()?;
        let cipher = st
            .cipher
            .as_ref()
            .ok_or_else(|| tampered("file has data but no header".into()))?;
        let mut mended = 0;
        for &b in blocks {
            if b >= self.layout().block_count(st.size) {
                continue;
            }
            let want = self.layout().block_len(b, st.size) as usize;
            if self.mend_block(cipher, b, want, write)? == Mend::Mended {
                mended += 1;
            }
        }
        if write && mended > 0 {
            self.file.sync_data()?;
        }
        Ok(mended)
    }
}
