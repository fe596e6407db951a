//! Adopted plaintext trees (`cloakfs init --adopt`): the one place that tells a directory's
//! plaintext entries from its encrypted ones, and that serves plaintext files.
//!
//! An entry is encrypted only if its backing name decrypts under the names key in its
//! directory (`NameCodec::classify_entry`); every other entry outside cloakfs's reserved
//! names is plaintext, shown under its own name. The collision rule (docs/FORMAT.md, section
//! "Adopted plaintext trees"): the mount refuses (EEXIST) to create an encrypted entry whose
//! plaintext name exists as a plaintext entry; where both exist anyway (made outside the
//! mount, or a crash inside `cloakfs encrypt`), lookups and listings show the encrypted one,
//! and fsck reports the other.
//!
//! Plaintext files are only opened for reading: an open that would write one encrypts it in
//! place first (`open_plain`). They are opened with the kernel's FUSE passthrough
//! (FOPEN_PASSTHROUGH) when the kernel offers it and the daemon may register backing files
//! (CAP_SYS_ADMIN, i.e. a root mount); their reads then never reach the daemon. Otherwise
//! they are read here, with plain `pread` on the backing file.
//!
//! Whether plaintext entries are served at all is [`PlainFiles::new`]'s: an adopted tree,
//! or a converted one (`plaintext_entries = "converted"`, recorded by `finish_conversion`)
//! that the user mounted with `--accept-plaintext`. Which ones, the tree's manifest's
//! (`io::plain_list`, FORMAT.md section 21.1): only the entries the tree held when it was
//! adopted, and none of those once encrypted or removed (retired), so a plaintext file the
//! storage puts under any name is never shown as the user's, and no write goes into it.
//! A listed entry renamed through the mount is encrypted first ([`CloakFs::encrypt_to_rename`]),
//! since its new name is not listed. `--accept-plaintext` serves every plaintext entry, as
//! trees adopted before manifests do (`cloakfs upgrade` lists theirs).

use crate::fs::CloakFs;
use crate::inode::{Inode, Kind};
use crate::sys::{self, errno, Res};
use cloakfs_core::format::config::{VolumeConfig, VolumeParams};
use cloakfs_core::format::names::{self, Classified, DirId, StoredName, DIRID_FILE};
use cloakfs_core::io::long_targets;
use fuser::{BackingId, Errno, FileAttr};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, Mode, OFlags};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex, Weak};

/// Mode of a `cloakfs.dirid` written into an adopted directory (as for new directories).
const DIRID_MODE: u32 = 0o440;

/// What a plaintext name of a directory refers to.
pub(crate) enum Resolved {
    /// An encrypted entry (existing or not: the name it has or would have).
    Encrypted(StoredName),
    /// A plaintext entry of an adopted tree; its backing name is its plaintext name.
    Plain(String),
    /// Nothing, in an adopted directory that has no ID yet.
    Absent,
}

/// An open plaintext file.
pub(crate) struct PlainHandle {
    pub(crate) file: OwnedFd,
    /// The kernel's reference to the backing file, while passthrough serves this handle.
    _backing: Option<Arc<BackingId>>,
}

/// Plaintext-entry state of a mount.
#[derive(Default)]
pub(crate) struct PlainFiles {
    /// Whether backing entries that are not encrypted are served as plaintext entries: an
    /// adopted tree, or a converted one mounted with `accept`.
    serving: std::sync::atomic::AtomicBool,
    /// Whether the config says (or this mount recorded) that the conversion finished.
    converted: std::sync::atomic::AtomicBool,
    /// Whether the user asked to serve plaintext entries of a converted tree.
    accept: bool,
    handles: Mutex<HashMap<u64, Arc<PlainHandle>>>,
    /// Backing IDs by node: the kernel wants one per inode while any handle has it open.
    backing: Mutex<HashMap<u64, Weak<BackingId>>>,
    /// Whether the kernel agreed to passthrough at init (and no registration failed since).
    pub(crate) passthrough: std::sync::atomic::AtomicBool,
    /// Held while a plaintext file is encrypted in place: two conversions of one file would
    /// write the same temporary file.
    converting: Mutex<()>,
}

impl PlainFiles {
    /// The state for a volume with `params`, plaintext entries of a converted tree served
    /// if `accept`.
    pub(crate) fn new(params: &VolumeParams, accept: bool) -> Self {
        Self {
            serving: (params.adopted || params.converted && accept).into(),
            converted: params.converted.into(),
            accept,
            ..Default::default()
        }
    }

    pub(crate) fn get(&self, fh: u64) -> Option<Arc<PlainHandle>> {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fh)
            .cloned()
    }

    pub(crate) fn remove(&self, fh: u64) -> Option<Arc<PlainHandle>> {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh)
    }

    fn insert(&self, fh: u64, h: PlainHandle) {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, Arc::new(h));
    }
}

fn exists(dir: rustix::fd::BorrowedFd<'_>, name: &str) -> bool {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok()
}

impl CloakFs {
    /// Whether this mount serves plaintext entries (see [`PlainFiles::serving`]).
    pub(crate) fn adopted(&self) -> bool {
        self.plain
            .serving
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The ID of `dir`, or None for an adopted directory that has none yet.
    pub(crate) fn dir_id_if_any(&self, dir: &Inode) -> Res<Option<DirId>> {
        if self.adopted() && dir.dir_id.get().is_none() {
            match rustix::fs::statat(dir.fd(), DIRID_FILE, AtFlags::SYMLINK_NOFOLLOW) {
                Err(rustix::io::Errno::NOENT) => return Ok(None),
                Err(e) => return Err(errno(e)),
                Ok(_) => {}
            }
        }
        self.dir_id(dir).map(Some)
    }

    /// Whether plaintext entry `name` of the directory with ID `id` is served: one its
    /// manifest lists, or any where the user accepts them all.
    pub(crate) fn plain_served(&self, id: Option<&DirId>, name: &[u8]) -> bool {
        self.plain.accept || self.volume.plaintext_listed(id, name)
    }

    /// Retires plaintext entry `name` of `dir` (encrypted or removed through this mount), so
    /// that a plaintext entry of that name is not served there again; a failure is logged
    /// (the entry itself is gone or encrypted already).
    pub(crate) fn retire_plain(&self, dir: &Inode, name: &[u8]) {
        let Ok(Some(id)) = self.dir_id_if_any(dir) else {
            return;
        };
        if let Err(e) = self.volume.retire_plaintext(&id, name) {
            tracing::warn!(
                "{}/{}: cannot record that this plaintext entry is gone, so a plaintext file \
                 put under its name would be shown: {e}",
                sys::describe(dir.fd()),
                String::from_utf8_lossy(name)
            );
        }
    }

    /// Whether plaintext `name` is a plaintext entry of adopted directory `dir` (ID `id`).
    fn is_plain_entry(&self, dir: &Inode, id: Option<&DirId>, name: &OsStr) -> Option<String> {
        let bytes = name.as_bytes();
        if !names::is_adoptable(bytes) {
            return None;
        }
        let name = std::str::from_utf8(bytes).ok()?;
        if !exists(dir.fd(), name) {
            return None;
        }
        let class = self
            .volume
            .names()
            .classify_entry(id, bytes, true, |_| Err("not a long name"));
        (class == Classified::Plain && self.plain_served(id, bytes)).then(|| name.to_string())
    }

    /// What plaintext `name` of `dir` refers to: the encrypted entry if it exists (it wins a
    /// collision), else a plaintext entry of that name in an adopted tree.
    pub(crate) fn resolve(&self, dir: &Inode, name: &OsStr) -> Res<Resolved> {
        if !self.adopted() {
            // Under the directory's ID, another copy of it, or a conflict copy's shown name.
            return self.locate(dir, name).map(Resolved::Encrypted);
        }
        names::validate_plain(name.as_bytes()).map_err(|e| Errno::from_i32(e.errno()))?;
        let id = self.dir_id_if_any(dir)?;
        let stored = match &id {
            Some(id) => {
                let stored = self
                    .volume
                    .names()
                    .encrypt(id, name.as_bytes())
                    .map_err(|e| Errno::from_i32(e.errno()))?;
                if exists(dir.fd(), stored.backing()) {
                    return Ok(Resolved::Encrypted(stored));
                }
                Some(stored)
            }
            None => None,
        };
        if let Some(plain) = self.is_plain_entry(dir, id.as_ref(), name) {
            return Ok(Resolved::Plain(plain));
        }
        Ok(stored.map_or(Resolved::Absent, Resolved::Encrypted))
    }

    /// The stored name for a new encrypted entry `name` in `dir`: refused (EEXIST) where a
    /// plaintext entry has that name; an adopted directory gets its ID first.
    pub(crate) fn name_for_new(&self, dir: &Inode, name: &OsStr) -> Res<StoredName> {
        if self.adopted() {
            names::validate_plain(name.as_bytes()).map_err(|e| Errno::from_i32(e.errno()))?;
            let id = self.dir_id_if_any(dir)?;
            if self.is_plain_entry(dir, id.as_ref(), name).is_some() {
                return Err(Errno::EEXIST);
            }
            if id.is_none() {
                self.give_dir_id(dir.fd())?;
            }
        }
        self.stored_name(dir, name)
    }

    /// Writes a fresh `cloakfs.dirid` into adopted directory `dir`, durable before any
    /// encrypted entry is named with it (or keeps the one a concurrent request wrote).
    fn give_dir_id(&self, dir: rustix::fd::BorrowedFd<'_>) -> Res<()> {
        let id = DirId::random();
        let dfd = sys::open_dir(dir).map_err(errno)?;
        match sys::write_new_durable(dfd.as_fd(), DIRID_FILE, &id.0, DIRID_MODE) {
            Ok(()) => rustix::fs::fsync(&dfd).map_err(errno),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            Err(e) => Err(sys::io_errno(&e)),
        }
    }

    /// Looks up plaintext entry `backing` of `parent` for the kernel.
    pub(crate) fn lookup_plain(
        &self,
        parent: &Inode,
        backing: &str,
        kind: Option<fuser::FileType>,
    ) -> Res<(Arc<Inode>, FileAttr)> {
        let fd = sys::open_node(parent.fd(), backing, kind, false).map_err(errno)?;
        let m = crate::attr::Meta::of_fd(fd.fd()).map_err(errno)?;
        let (inode, live) = self
            .inodes
            .lookup(fd, &m, parent.nodeid, backing.as_bytes());
        inode.mark_plain();
        if let Some(n) = live.and_then(|live| self.pruner.due(live, self.inodes.clock())) {
            self.pruner.send(self.inodes.least_used(n));
        }
        let attr = self.attr_of(&inode, &m);
        Ok((inode, attr))
    }

    /// Opens plaintext file `inode` for reading, for handle `fh`. An open that would write
    /// (`writes`: write access or O_TRUNC) first encrypts the file in place and answers
    /// ESTALE, so that the kernel looks its name up again and opens the encrypted file: no
    /// byte written through the mount goes into a plaintext file, not even into one the
    /// storage planted under a name the user writes.
    pub(crate) fn open_plain(&self, inode: &Inode, fh: u64, writes: bool) -> Res<()> {
        if writes {
            return self.encrypt_before_write(inode);
        }
        let file = rustix::fs::open(
            sys::proc_path(inode.fd()),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        self.plain.insert(
            fh,
            PlainHandle {
                file,
                _backing: None,
            },
        );
        Ok(())
    }

    /// [`Self::encrypt_in_place`] for an open of plaintext file `inode` that would write it;
    /// Err(ESTALE) once the file is encrypted. A file that cannot be encrypted now (other
    /// hard links, or open elsewhere) is not opened for writing at all.
    fn encrypt_before_write(&self, inode: &Inode) -> Res<()> {
        let (parent, name) = self.inodes.seen_as(inode.nodeid).ok_or(Errno::ESTALE)?;
        let dir = self.node(fuser::INodeNo(parent))?;
        let name = OsStr::from_bytes(&name);
        // Renamed or replaced outside the mount: the kernel is to look the name up again.
        let now = rustix::fs::statat(dir.fd(), name, AtFlags::SYMLINK_NOFOLLOW);
        let node = rustix::fs::fstat(inode.fd()).map_err(errno)?;
        if !now.is_ok_and(|st| (st.st_dev, st.st_ino) == (node.st_dev, node.st_ino)) {
            return Err(Errno::ESTALE);
        }
        match self.encrypt_in_place(&dir, name) {
            Ok(Encrypted::Now | Encrypted::Already) => Err(Errno::ESTALE),
            Err(e) => {
                let why = match e {
                    Errno::EMLINK => "it has other hard links, which would keep the plaintext",
                    Errno::EBUSY => "it is open; close it and open it again",
                    _ => "it cannot be encrypted",
                };
                tracing::warn!(
                    "{:?}: plaintext file not opened for writing, since writing encrypts it \
                     first and {why} ({e:?})",
                    name
                );
                Err(e)
            }
        }
    }

    /// Registers the backing file of plaintext handle `fh` of `inode` with the kernel for
    /// passthrough, sharing one backing ID per node. None: served by the daemon.
    pub(crate) fn passthrough_for(
        &self,
        inode: &Inode,
        fh: u64,
        register: impl FnOnce(&OwnedFd) -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        use std::sync::atomic::Ordering;
        if !self.plain.passthrough.load(Ordering::Relaxed) {
            return None;
        }
        let mut handles = self.plain.handles.lock().unwrap_or_else(|e| e.into_inner());
        let handle = handles.get_mut(&fh)?;
        let mut backing = self.plain.backing.lock().unwrap_or_else(|e| e.into_inner());
        let id = match backing.get(&inode.nodeid).and_then(Weak::upgrade) {
            Some(id) => id,
            None => match register(&handle.file) {
                Ok(id) => {
                    let id = Arc::new(id);
                    backing.insert(inode.nodeid, Arc::downgrade(&id));
                    id
                }
                Err(e) => {
                    self.plain.passthrough.store(false, Ordering::Relaxed);
                    tracing::warn!(
                        "FUSE passthrough refused ({e}): plaintext files are served through \
                         the daemon"
                    );
                    return None;
                }
            },
        };
        let h = Arc::get_mut(handle)?;
        h._backing = Some(id.clone());
        Some(id)
    }

    /// The stored name an encrypted entry (`from` in `p`) gets when renamed to `newname` in
    /// `np`, and the plaintext file it replaces there, removed after the rename (a crash in
    /// between leaves both, and the encrypted one is shown). A plaintext directory it
    /// replaces must be empty and goes first; an exchange with a plaintext entry is EXDEV.
    pub(crate) fn rename_target(
        &self,
        p: &Inode,
        from: &StoredName,
        np: &Inode,
        newname: &OsStr,
        flags: fuser::RenameFlags,
    ) -> Res<(StoredName, Option<String>)> {
        let plain = match self.resolve(np, newname)? {
            Resolved::Encrypted(stored) => return Ok((stored, None)),
            Resolved::Plain(plain) => Some(plain),
            Resolved::Absent => None,
        };
        if let Some(plain) = &plain {
            if flags.contains(fuser::RenameFlags::RENAME_EXCHANGE) {
                return Err(Errno::EXDEV);
            }
            if flags.contains(fuser::RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            let is_dir = |dir: &Inode, name: &str| {
                rustix::fs::statat(dir.fd(), name, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
                    .map_err(errno)
            };
            match (is_dir(p, from.backing())?, is_dir(np, plain)?) {
                (false, true) => return Err(Errno::EISDIR),
                (true, false) => return Err(Errno::ENOTDIR),
                (true, true) => self.remove_dir(np, &StoredName::Short(plain.clone()))?,
                (false, false) => {}
            }
        }
        if self.dir_id_if_any(np)?.is_none() {
            self.give_dir_id(np.fd())?;
        }
        let to = self.stored_name(np, newname)?;
        Ok((to, plain))
    }

    /// Renames plaintext entry `from` of `p` to `newname` in `np`, where it stays plaintext.
    /// It never replaces an encrypted entry (EXDEV: `mv` then copies, which encrypts).
    pub(crate) fn rename_plain(
        &self,
        p: &Inode,
        from: &str,
        np: &Inode,
        newname: &OsStr,
        flags: fuser::RenameFlags,
    ) -> Res<()> {
        if !names::is_adoptable(newname.as_bytes()) {
            return Err(Errno::EINVAL);
        }
        let to = std::str::from_utf8(newname.as_bytes()).map_err(|_| Errno::EINVAL)?;
        if let Resolved::Encrypted(stored) = self.resolve(np, newname)? {
            if exists(np.fd(), stored.backing()) {
                return Err(Errno::EXDEV);
            }
        }
        let mut rflags = rustix::fs::RenameFlags::empty();
        if flags.contains(fuser::RenameFlags::RENAME_EXCHANGE) {
            rflags |= rustix::fs::RenameFlags::EXCHANGE;
        }
        if flags.contains(fuser::RenameFlags::RENAME_NOREPLACE) {
            rflags |= rustix::fs::RenameFlags::NOREPLACE;
        }
        rustix::fs::renameat_with(p.fd(), from, np.fd(), to, rflags).map_err(errno)?;
        // Its node's name, by which an open for writing finds it to encrypt it.
        let mut now_named = vec![(np, to)];
        if rflags.contains(rustix::fs::RenameFlags::EXCHANGE) {
            now_named.push((p, from));
        }
        for (dir, name) in now_named {
            if let Ok(st) = rustix::fs::statat(dir.fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
                self.inodes
                    .renamed(st.st_dev, st.st_ino, dir.nodeid, name.as_bytes());
            }
        }
        Ok(())
    }

    /// Truncates plaintext file `inode` to `size`.
    pub(crate) fn truncate_plain(&self, inode: &Inode, size: u64) -> Res<()> {
        let f = rustix::fs::open(
            sys::proc_path(inode.fd()),
            OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        rustix::fs::ftruncate(&f, size).map_err(errno)
    }

    /// fallocate(2) on plaintext file `inode`.
    pub(crate) fn fallocate_plain(
        &self,
        inode: &Inode,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Res<()> {
        let f = rustix::fs::open(
            sys::proc_path(inode.fd()),
            OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        rustix::fs::fallocate(
            &f,
            rustix::fs::FallocateFlags::from_bits_retain(mode as u32),
            offset,
            length,
        )
        .map_err(errno)
    }

    /// Whether `inode` is a plaintext regular file.
    pub(crate) fn is_plain_file(inode: &Inode) -> bool {
        inode.kind == Kind::File && inode.is_plain()
    }
}

/// What `CloakFs::encrypt_in_place` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Encrypted {
    /// The plaintext entry is now encrypted.
    Now = 0,
    /// It already was (a leftover plaintext copy of an interrupted run was removed).
    Already = 1,
}

impl CloakFs {
    /// Encrypts plaintext entry `name` of directory `dir` in place (`cloakfs encrypt`), so
    /// that a crash at any point leaves it plaintext or encrypted, never a mix. A file or a
    /// symlink is written encrypted under a hidden temporary name derived from its stored
    /// name (a resumed run starts it again), synced, renamed to its stored name and the
    /// directory synced; only then is the plaintext unlinked and the directory synced again.
    /// Between the two, both exist with equal contents and the encrypted one is shown; a
    /// resumed run removes the plaintext. A directory (given its ID first) or a special file
    /// keeps its object and is renamed to its stored name.
    pub(crate) fn encrypt_in_place(&self, dir: &Inode, name: &OsStr) -> Res<Encrypted> {
        let done = self.convert_in_place(dir, name)?;
        // The kernel's name now leads to the plaintext: it must look it up again.
        if let Some(n) = self.pruner.notifier() {
            let _ = n.inval_entry(fuser::INodeNo(dir.nodeid), name);
        }
        Ok(done)
    }

    /// [`Self::encrypt_in_place`] without telling the kernel.
    fn convert_in_place(&self, dir: &Inode, name: &OsStr) -> Res<Encrypted> {
        self.writable()?;
        if !self.adopted() {
            return Err(Errno::EOPNOTSUPP);
        }
        let _one_at_a_time = self
            .plain
            .converting
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let dfd = dir.fd();
        let plain = match self.resolve(dir, name)? {
            Resolved::Encrypted(stored) if exists(dfd, stored.backing()) => {
                if let Some(left) = std::str::from_utf8(name.as_bytes())
                    .ok()
                    .filter(|n| names::is_adoptable(n.as_bytes()) && exists(dfd, n))
                {
                    rustix::fs::unlinkat(dfd, left, AtFlags::empty()).map_err(errno)?;
                    sys::sync_dir(dfd).map_err(errno)?;
                }
                return Ok(Encrypted::Already);
            }
            Resolved::Plain(plain) => plain,
            _ => return Err(Errno::ENOENT),
        };
        let st =
            rustix::fs::statat(dfd, plain.as_str(), AtFlags::SYMLINK_NOFOLLOW).map_err(errno)?;
        let format = st.st_mode & libc::S_IFMT;
        let subdir = if format == libc::S_IFDIR {
            Some(self.dir_to_encrypt(dfd, &plain)?)
        } else {
            None
        };
        if format == libc::S_IFREG {
            if st.st_nlink > 1 {
                // Its other names would keep the plaintext.
                return Err(Errno::EMLINK);
            }
            if self
                .inodes
                .by_key(st.st_dev, st.st_ino)
                .is_some_and(|i| !i.wait_closed(std::time::Duration::from_secs(1)))
            {
                return Err(Errno::EBUSY);
            }
        }
        if self.dir_id_if_any(dir)?.is_none() {
            self.give_dir_id(dfd)?;
        }
        let stored = self.stored_name(dir, name)?;
        if format == libc::S_IFREG || format == libc::S_IFLNK {
            let tmp = format!(
                "cloakfs.tmp.encrypt.{}",
                &stored.backing()[stored.backing().len().saturating_sub(22)..]
            );
            let written = if format == libc::S_IFREG {
                self.write_encrypted_copy(dfd, &plain, &tmp, &st)
            } else {
                self.write_encrypted_symlink(dfd, &plain, &tmp, &st)
            }
            .and_then(|()| self.write_sidecar(dfd, &stored))
            .and_then(|_| {
                rustix::fs::renameat_with(
                    dfd,
                    tmp.as_str(),
                    dfd,
                    stored.backing(),
                    rustix::fs::RenameFlags::NOREPLACE,
                )
                .map_err(errno)?;
                sys::sync_dir(dfd).map_err(errno)
            });
            if let Err(e) = written {
                let _ = rustix::fs::unlinkat(dfd, tmp.as_str(), AtFlags::empty());
                return Err(e);
            }
            // The encrypted entry exists: the name is not to be plaintext again.
            self.retire_plain(dir, plain.as_bytes());
            rustix::fs::unlinkat(dfd, plain.as_str(), AtFlags::empty()).map_err(errno)?;
        } else {
            if let Some(sub) = &subdir {
                // Its entries' names are bound to the ID, which is durable before they can be.
                if matches!(
                    rustix::fs::statat(sub, DIRID_FILE, AtFlags::SYMLINK_NOFOLLOW),
                    Err(rustix::io::Errno::NOENT)
                ) {
                    self.give_dir_id(sub.as_fd())?;
                }
            }
            self.write_sidecar(dfd, &stored)?;
            rustix::fs::renameat_with(
                dfd,
                plain.as_str(),
                dfd,
                stored.backing(),
                rustix::fs::RenameFlags::NOREPLACE,
            )
            .map_err(errno)?;
            if let Some(node) = self.inodes.by_key(st.st_dev, st.st_ino) {
                node.mark_encrypted();
            }
            self.retire_plain(dir, plain.as_bytes());
        }
        sys::sync_dir(dfd).map_err(errno)?;
        Ok(Encrypted::Now)
    }

    /// Encrypts listed plaintext entry `name` of `dir` so that it can be renamed: its new
    /// name would not be listed, so as plaintext it would vanish. The kernel is told to look
    /// the name up again once the rename's locks are released. Where it cannot be encrypted
    /// in place (other hard links, open, a directory with extended attributes) EXDEV, after
    /// which `mv` copies it through the mount, which encrypts it.
    pub(crate) fn encrypt_to_rename(&self, dir: &Inode, name: &OsStr) -> Res<StoredName> {
        match self.convert_in_place(dir, name) {
            Ok(_) => {}
            Err(Errno::EMLINK | Errno::EBUSY | Errno::EXDEV) => return Err(Errno::EXDEV),
            Err(e) => return Err(e),
        }
        self.forget_name_later(dir.nodeid, name);
        match self.resolve(dir, name)? {
            Resolved::Encrypted(stored) => Ok(stored),
            _ => Err(Errno::EIO),
        }
    }

    /// Has the kernel forget name `name` of directory `dir` from a thread of its own: during
    /// a rename the kernel holds the directory's lock, which the invalidation waits for.
    pub(crate) fn forget_name_later(&self, dir: u64, name: &OsStr) {
        let Some(n) = self.pruner.notifier().cloned() else {
            return;
        };
        let name = name.to_os_string();
        let spawned = std::thread::Builder::new()
            .name("cloakfs-forget".into())
            .spawn(move || {
                // ENOENT: gone already; nothing to do either way.
                let _ = n.inval_entry(fuser::INodeNo(dir), &name);
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start a thread to have the kernel look a name up again: {e}");
        }
    }

    /// Whether this mount encrypts a plaintext entry before renaming it (a tree with a
    /// manifest, whose renamed entries it would not list).
    pub(crate) fn encrypts_to_rename(&self) -> bool {
        self.volume.config().params.listed
    }

    /// Plaintext directory `name` of `dfd`, opened, if it can be encrypted by a rename: its
    /// extended attributes (security-module labels aside) would have to be re-encrypted in
    /// place, which no crash may leave half done, so a directory with any is refused (EXDEV;
    /// copied through the mount, it is encrypted).
    fn dir_to_encrypt(&self, dfd: rustix::fd::BorrowedFd<'_>, name: &str) -> Res<OwnedFd> {
        let sub = sys::open_subdir_readable(dfd, name).map_err(errno)?;
        let mut names = vec![0u8; 64 * 1024];
        let n = rustix::fs::flistxattr(&sub, &mut names).map_err(errno)?;
        if names[..n]
            .split(|&b| b == 0)
            .any(|x| !x.is_empty() && !crate::xattr::is_lsm_label(x))
        {
            tracing::warn!(
                "{}/{name}: a plaintext directory with extended attributes is not encrypted \
                 in place; copy it through the mount",
                sys::describe(dfd)
            );
            return Err(Errno::EXDEV);
        }
        Ok(sub)
    }

    /// Writes plaintext file `plain` of `dfd` encrypted to `tmp` (created or truncated),
    /// with its mode, owner, times and xattrs, and syncs it.
    fn write_encrypted_copy(
        &self,
        dfd: rustix::fd::BorrowedFd<'_>,
        plain: &str,
        tmp: &str,
        st: &rustix::fs::Stat,
    ) -> Res<()> {
        let src = rustix::fs::openat(
            dfd,
            plain,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        let out = rustix::fs::openat(
            dfd,
            tmp,
            OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(errno)?;
        let cf = cloakfs_core::io::file::ContentFile::open(
            self.codec.clone(),
            std::fs::File::from(rustix::io::dup(&out).map_err(errno)?),
        )
        .map_err(|e| self.fail(&e, out.as_fd(), None))?;
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        loop {
            let n = rustix::io::pread(&src, &mut buf, off).map_err(errno)?;
            if n == 0 {
                break;
            }
            cf.write_at(off, &buf[..n])
                .map_err(|e| self.fail(&e, out.as_fd(), None))?;
            off += n as u64;
        }
        let _ = rustix::fs::fchown(
            &out,
            Some(rustix::fs::Uid::from_raw(st.st_uid)),
            Some(rustix::fs::Gid::from_raw(st.st_gid)),
        );
        rustix::fs::fchmod(&out, Mode::from_raw_mode(st.st_mode & 0o7777)).map_err(errno)?;
        self.carry_xattrs(src.as_fd(), out.as_fd())?;
        rustix::fs::futimens(&out, &times_of(st)).map_err(errno)?;
        rustix::fs::fsync(&out).map_err(errno)
    }

    /// Writes plaintext symlink `plain` of `dfd` encrypted to `tmp` (replacing one a crash
    /// left), with its owner and times; a long target is stored first (section 10.1).
    fn write_encrypted_symlink(
        &self,
        dfd: rustix::fd::BorrowedFd<'_>,
        plain: &str,
        tmp: &str,
        st: &rustix::fs::Stat,
    ) -> Res<()> {
        let target = rustix::fs::readlinkat(dfd, plain, Vec::new()).map_err(errno)?;
        let enc = self
            .volume
            .meta()
            .encrypt_symlink(target.as_bytes())
            .map_err(|e| Errno::from_i32(e.errno()))?;
        let root = self.node(fuser::INodeNo(self.inodes.root()))?;
        long_targets::store(root.fd(), &enc).map_err(|e| self.fail(&e, root.fd(), None))?;
        match rustix::fs::unlinkat(dfd, tmp, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(errno(e)),
        }
        rustix::fs::symlinkat(enc.backing_target().as_str(), dfd, tmp).map_err(errno)?;
        let _ = rustix::fs::chownat(
            dfd,
            tmp,
            Some(rustix::fs::Uid::from_raw(st.st_uid)),
            Some(rustix::fs::Gid::from_raw(st.st_gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        );
        rustix::fs::utimensat(dfd, tmp, &times_of(st), AtFlags::SYMLINK_NOFOLLOW).map_err(errno)
    }

    /// Records that this adopted tree has no plaintext entry left (`cloakfs encrypt -r` of
    /// the mount's root `dir`, once it encrypted every entry it saw): walks the whole cipher
    /// directory and, only if it finds no plaintext entry, writes the config as it is on
    /// disk now (its MAC checked) with `plaintext_entries = "converted"`. This mount then
    /// serves plaintext entries no more, unless it was told to accept them. ENOTEMPTY, the
    /// first entry left logged, while there is one.
    pub(crate) fn finish_conversion(&self, dir: &Inode) -> Res<()> {
        use cloakfs_core::tools::walk::{InternalKind, Item, Walker};
        use std::sync::atomic::Ordering;
        self.writable()?;
        if dir.nodeid != self.inodes.root() {
            return Err(Errno::EINVAL);
        }
        if self.plain.converted.load(Ordering::Relaxed) {
            return Ok(());
        }
        if !self.volume.config().params.adopted {
            return Err(Errno::EOPNOTSUPP);
        }
        if let Some(problem) = self.volume.plaintext_list_problem() {
            // Its plaintext entries are hidden, not gone.
            tracing::warn!(
                "the adopted tree's manifest: {problem}; the conversion is not recorded as \
                 finished"
            );
            return Err(Errno::EIO);
        }
        let _one_at_a_time = self
            .plain
            .converting
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let root = std::path::PathBuf::from(sys::proc_path(dir.fd()));
        for item in Walker::new(&self.volume, &root) {
            if let Item::Internal(i) = item {
                if matches!(
                    i.kind,
                    InternalKind::Plaintext | InternalKind::PlaintextShadowed
                ) {
                    tracing::warn!(
                        "{}: still plaintext, so the conversion is not recorded as finished",
                        i.backing
                            .strip_prefix(&root)
                            .unwrap_or(&i.backing)
                            .display()
                    );
                    return Err(Errno::ENOTEMPTY);
                }
            }
        }
        let mk = self.volume.master_key();
        let mut config = VolumeConfig::load(&root)
            .and_then(|c| c.verify(mk).map(|()| c))
            .map_err(|e| self.fail(&e, dir.fd(), Some("config")))?;
        if config.params.adopted {
            config.params.adopted = false;
            config.params.converted = true;
            config.seal(mk);
            config
                .save(&root)
                .map_err(|e| self.fail(&e, dir.fd(), Some("config")))?;
            self.config_watch.wrote(config);
        }
        self.plain.converted.store(true, Ordering::Relaxed);
        if !self.plain.accept {
            self.plain.serving.store(false, Ordering::Relaxed);
        }
        tracing::info!("adopted tree converted: no plaintext entry is served from now on");
        Ok(())
    }
}

/// The access and modification times of `st`.
fn times_of(st: &rustix::fs::Stat) -> rustix::fs::Timestamps {
    rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec as _,
        },
    }
}
