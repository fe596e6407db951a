//! Plaintext I/O on one backing file: random-access reads and writes, truncate, holes.
//!
//! [`ContentFile`] owns the backing file descriptor and the file's cipher, and serializes
//! writers against readers with a read-write lock, so any number of threads may share it.
//! Writes that cover whole blocks skip read-modify-write; very large calls are sealed and
//! opened on all cores (see [`PARALLEL_MIN_BLOCKS`]). A write that fails (a full disk) leaves
//! the plaintext as it was: see [`ContentFile::write_at`]. Streams start reaching the disk
//! while they are written, and leave no ciphertext in the backing file's page cache (see
//! `stream`).
//!
//! This module holds the file's state: how it is loaded, and kept current with other clients
//! (see `shared`). The rest is split by concern: `read` (reads), `write` (writes, growing the
//! file, putting back the end a failed write changed), `size` (truncate, holes, fallocate),
//! `mend` (blocks that clients writing at once without locks leave), `file_header` (the file
//! ID and its recipients).

use crate::error::{Error, Result};
use crate::format::content::{ContentCodec, FileCipher};
use crate::format::layout::Layout;
use crate::io::header;
use crate::io::lease::{Lease, LeaseGuard};
use crate::io::shared::{force_stat, ChangeStamp, Sharing};
use crate::io::stream::Batches;
use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

mod file_header;
mod mend;
mod read;
mod size;
#[cfg(test)]
pub(crate) mod tests;
mod write;

pub use file_header::new_file_header;

/// Calls of at least this many blocks are sealed or opened on rayon's pool, the rest on the
/// calling thread. FUSE requests (at most 1 MiB, 256 blocks of 4 KiB) stay below it: they
/// come many at a time, on several worker threads, which keeps the cores busy already.
/// Splitting each one across the pool as well (from 32 blocks, before) made the daemon spend
/// about 5-10% more CPU on a streamed 1 GiB write and 5-15% more on its cold read on a quiet
/// 2-core VM, more on a busy one, with the same or longer times: the pool's threads spin
/// between requests. One large call
/// (the offline tools) still spreads over the cores.
pub const PARALLEL_MIN_BLOCKS: u64 = 512;

thread_local! {
    static SEALED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static PLAIN: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

struct State {
    /// Large writes since the last finished batch (see `stream`).
    written: Batches,
    /// Whether the header has been read (it is read on first use, not at open, so that
    /// opening a file does not touch the backing file's access time).
    loaded: bool,
    cipher: Option<FileCipher>,
    /// Who the file's key is granted to (a shared file): a fresh header keeps them.
    recipients: Vec<String>,
    /// Whether the file ID is known to be this file's own: drawn here, or one of the file's
    /// blocks authenticated under it. An ID found in a file of holes only proves nothing (a
    /// copied header): new data is never sealed under it (FORMAT.md 8.4).
    id_owned: bool,
    size: u64,
    /// Whether the backing file may have holes, which a write inside the file fills and so
    /// needs new space for (see `write_at`).
    holes: bool,
}

/// One backing file seen as plaintext.
pub struct ContentFile {
    codec: Arc<ContentCodec>,
    file: Arc<File>,
    state: RwLock<State>,
    /// Large reads since the last finished batch (see `stream`); readers share `state`.
    read: Mutex<Batches>,
    /// Whether other clients may change the backing file (see `shared`).
    sharing: Sharing,
    /// Shared: the exclusive hold changes are made under, kept across a burst of them.
    lease: Option<Arc<Lease>>,
}

impl std::fmt::Debug for ContentFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentFile")
            .field("fd", &self.file.as_raw_fd())
            .finish_non_exhaustive()
    }
}

fn tampered(msg: String) -> Error {
    Error::Tampered(msg)
}

/// Whether `file` lies on a FUSE file system (sshfs).
fn on_fuse(file: &File) -> bool {
    const FUSE_SUPER_MAGIC: u64 = 0x6573_5546;
    // `f_type`'s width differs between targets.
    rustix::fs::fstatfs(file).is_ok_and(|st| st.f_type as u64 == FUSE_SUPER_MAGIC)
}

impl ContentFile {
    /// Wraps an open backing file (opened read-write for writing). The header is read on
    /// first use.
    pub fn open(codec: Arc<ContentCodec>, file: File) -> Result<Self> {
        let meta = file.metadata()?;
        Self::open_stated(codec, file, meta.len(), meta.blocks())
    }

    /// [`ContentFile::open`] for a backing file whose length and allocated 512-byte units
    /// (`st_blocks`) the caller has just read, as after creating it.
    pub fn open_stated(
        codec: Arc<ContentCodec>,
        file: File,
        len: u64,
        blocks: u64,
    ) -> Result<Self> {
        let state = State {
            written: Batches::default(),
            loaded: len == 0,
            cipher: None,
            recipients: Vec::new(),
            id_owned: false,
            size: codec.layout().plain_size_lenient(len),
            holes: may_have_holes(len, blocks),
        };
        let this = Self {
            codec,
            file: Arc::new(file),
            state: RwLock::new(state),
            read: Mutex::new(Batches::default()),
            sharing: Sharing::Alone,
            lease: None,
        };
        // Whether the file may be opened at all is decided by its header.
        if this.codec.key_source().opens_at_open() {
            this.load_at(&mut this.write_state(), len)?;
        }
        Ok(this)
    }

    /// The same file, coordinated with other clients as `sharing` says.
    pub fn with_sharing(mut self, sharing: Sharing) -> Self {
        if sharing.unlocked() && on_fuse(&self.file) {
            // The store's kernel client (FUSE) sends a write through its page cache from a
            // page that is not cached in a request of its own, which would cut a block in
            // two (see `write_sealed`); direct I/O sends it as it is, in requests cut only
            // by the store's largest write (and needs no alignment there).
            let direct = rustix::fs::fcntl_getfl(&*self.file).and_then(|fl| {
                rustix::fs::fcntl_setfl(&*self.file, fl | rustix::fs::OFlags::DIRECT)
            });
            if let Err(e) = direct {
                tracing::debug!("direct I/O on a backing file: {e}");
            }
        }
        self.sharing = sharing;
        self.lease = sharing.is_shared().then(|| Lease::new(self.file.clone()));
        self
    }

    /// Reads the size and header again (after another client may have changed them), keeping
    /// what is known about the file ID if the header still holds it.
    fn reload(&self, st: &mut State) -> Result<()> {
        let (len, blocks) = self.sharing.fresh_size(&self.file)?;
        self.reload_as(st, len, blocks)
    }

    /// [`Self::reload`] of a backing file just found `len` bytes long, `blocks` allocated.
    fn reload_as(&self, st: &mut State, len: u64, blocks: u64) -> Result<()> {
        st.size = self.layout().plain_size_lenient(len);
        st.holes = may_have_holes(len, blocks);
        let old = st.cipher.as_ref().map(FileCipher::id);
        st.loaded = false;
        st.cipher = None;
        self.load_at(st, len)?;
        let new = st.cipher.as_ref().map(FileCipher::id);
        st.id_owned &= new.is_some() && new == old;
        Ok(())
    }

    /// The state, loaded and held against other clients' changes, for changing the contents.
    /// The lease is let go of before the state (tuple fields drop in order).
    fn changing(&self) -> Result<(Option<LeaseGuard<'_>>, RwLockWriteGuard<'_, State>)> {
        let mut st = self.write_state();
        let lease = self.quiet()?;
        // Shared, a file without data is read again every time: another client may have
        // given it its header since, which must be kept (see `new_header`).
        if lease.as_ref().is_some_and(LeaseGuard::fresh) || (self.lease.is_some() && st.size == 0) {
            self.reload(&mut st)?;
        } else {
            self.load(&mut st)?;
        }
        Ok((lease, st))
    }

    /// Shared: the file's lease, under which no other client changes it (`None` when alone).
    /// Taken (exclusively) to read again a file whose read failed its check too: a shared
    /// lock on the same open file description would turn a held lease into a shared one.
    fn quiet(&self) -> Result<Option<LeaseGuard<'_>>> {
        Ok(match &self.lease {
            Some(l) => Some(l.take()?),
            None => None,
        })
    }

    /// Shared: lets the file's lease go, after flushing this client's changes to the store
    /// (at close, fsync, and before an application's lock changes hands); returns that
    /// flush's failure, or one of an earlier letting go not yet told. Nothing to do when
    /// alone.
    pub fn settle(&self) -> Result<()> {
        match &self.lease {
            Some(l) => Ok(l.settle()?),
            None => Ok(()),
        }
    }

    /// Brings the cached size and header up to date with the store, where other clients may
    /// have changed them (at open: close-to-open consistency), and returns the file's change
    /// stamp. The pages of the backing file the store's client has cached are dropped unless
    /// the stamp is `seen`, the one this mount took last (and fine-grained): then no client
    /// changed the file since they were read. Nothing to do when alone.
    ///
    /// Read without the lock, as reads are: a writer on another client seldom meets an open,
    /// and a header it is rewriting fails its check, so that case alone reads again under the
    /// file's lease, once no other client is changing the file.
    pub fn revalidate(&self, seen: Option<ChangeStamp>) -> Result<Option<ChangeStamp>> {
        if !self.sharing.is_shared() {
            return Ok(None);
        }
        let mut st = self.write_state();
        let stat = force_stat(&self.file).map_err(std::io::Error::from)?;
        let stamp = ChangeStamp::of(&stat);
        if seen != Some(stamp) || !stamp.fine_grained() {
            self.sharing.forget_cached(&self.file);
        }
        match self.reload_as(&mut st, stat.stx_size, stat.stx_blocks) {
            Err(Error::Tampered(_)) => {
                let _quiet = self.quiet()?;
                self.reload(&mut st)?;
            }
            r => r?,
        }
        Ok(Some(stamp))
    }

    /// Reads and checks the header if not done yet.
    fn load(&self, st: &mut State) -> Result<()> {
        if st.loaded {
            return Ok(());
        }
        let len = self.file.metadata()?.len();
        self.load_at(st, len)
    }

    /// [`Self::load`] of a backing file `len` bytes long.
    fn load_at(&self, st: &mut State, len: u64) -> Result<()> {
        if let Some(h) = header::read(&self.codec, &self.file, len)? {
            let opened = self.codec.open_header(&h)?;
            st.cipher = Some(opened.cipher);
            st.recipients = opened.recipients;
        }
        st.loaded = true;
        Ok(())
    }

    /// The state with its header loaded, for readers.
    fn loaded_state(&self) -> Result<RwLockReadGuard<'_, State>> {
        {
            let st = self.read_state();
            if st.loaded {
                return Ok(st);
            }
        }
        self.load(&mut self.write_state())?;
        Ok(self.read_state())
    }

    /// The backing file.
    pub fn backing(&self) -> &File {
        &self.file
    }

    fn layout(&self) -> Layout {
        self.codec.layout()
    }

    fn read_state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_state(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Plaintext size.
    pub fn size(&self) -> u64 {
        self.read_state().size
    }

    /// Re-reads the size from the backing file (after it changed behind our back).
    pub fn refresh_size(&self) -> Result<u64> {
        let mut st = self.write_state();
        let meta = self.file.metadata()?;
        st.size = self.layout().plain_size_lenient(meta.len());
        st.holes = may_have_holes(meta.len(), meta.blocks());
        Ok(st.size)
    }

    /// Flushes data (and metadata unless `datasync`) to stable storage.
    pub fn sync(&self, datasync: bool) -> Result<()> {
        self.settle()?;
        if datasync {
            self.file.sync_data()?;
        } else {
            self.file.sync_all()?;
        }
        Ok(())
    }
}

/// Whether a backing file may have holes: it occupies fewer 512-byte units than its length
/// needs. Delayed allocation counts as occupied (ext4 includes it in `st_blocks`); a
/// compressing file system can make this true without holes, which only costs reservations.
fn may_have_holes(len: u64, blocks: u64) -> bool {
    blocks.saturating_mul(512) < len
}

fn fallocate(file: &File, mode: i32, off: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: fallocate on a valid, owned file descriptor with plain integer arguments.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), mode, off as i64, len as i64) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
