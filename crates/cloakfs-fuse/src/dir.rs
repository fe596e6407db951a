//! Directories: directory IDs, name encryption per directory, long-name sidecars, listings,
//! and the crash-safe creation and removal of backing directories.

use crate::fs::CloakFs;
use crate::inode::Inode;
use crate::sys::{self, errno, Res};
use cloakfs_core::format::names::{self, Classified, DirId, EntryKind, StoredName, DIRID_FILE};
use cloakfs_core::tools::paths::{parse_dir_id, DIRID_LEN};
use fuser::{Errno, FileType};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, Dir, Mode, RawDir, RenameFlags};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::{Arc, Mutex};

/// Mode of `cloakfs.dirid` files (gocryptfs uses the same for its `gocryptfs.diriv`).
const DIRID_MODE: u32 = 0o440;
/// Mode of long-name sidecar files.
const SIDECAR_MODE: u32 = 0o440;
/// Prefix of directories being built by mkdir (internal: never listed).
const TMP_PREFIX: &str = "cloakfs.tmp.";

/// One entry of a plaintext directory listing.
#[derive(Debug, Clone)]
pub(crate) struct ListEntry {
    pub name: OsString,
    pub ino: u64,
    pub kind: FileType,
    /// The backing name (None for `.` and `..`), for readdirplus lookups.
    pub backing: Option<String>,
    /// A plaintext entry of an adopted tree.
    pub plain: bool,
    /// The backing directory offset that resumes the listing after this entry.
    pub next: u64,
}

/// An open directory: the listing snapshot its readdir offsets point into.
#[derive(Debug, Default)]
pub(crate) struct DirHandle {
    pub state: Mutex<Snapshot>,
}

/// A directory handle's listing and where the last reply stopped in it.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub entries: Option<Arc<Vec<ListEntry>>>,
    /// Index of the first entry not yet replied (finds the next offset without a search).
    pub resume: usize,
}

pub(crate) fn kind_of_dirent(t: rustix::fs::FileType) -> Option<FileType> {
    use rustix::fs::FileType as T;
    Some(match t {
        T::RegularFile => FileType::RegularFile,
        T::Directory => FileType::Directory,
        T::Symlink => FileType::Symlink,
        T::Fifo => FileType::NamedPipe,
        T::Socket => FileType::Socket,
        T::CharacterDevice => FileType::CharDevice,
        T::BlockDevice => FileType::BlockDevice,
        T::Unknown => return None,
    })
}

/// Bytes of directory entries one `getdents` of a backing directory asks for.
const LIST_BUFFER: usize = 64 << 10;

impl CloakFs {
    /// The ID of directory `dir`, read from its `cloakfs.dirid` on first use.
    pub(crate) fn dir_id(&self, dir: &Inode) -> Res<DirId> {
        if let Some(id) = dir.dir_id.get() {
            return Ok(id);
        }
        let id = self.read_dir_id(dir)?;
        Ok(dir.dir_id.get_or_init(id))
    }

    /// Re-reads the ID of directory `dir` whose ID is known, and takes the new one if its ID
    /// file was replaced (a sync client renaming another device's version into place):
    /// returns whether it changed. One stat when nothing changed (the cache is keyed by it).
    pub(crate) fn reload_dir_id(&self, dir: &Inode) -> bool {
        if dir.dir_id.get().is_none() || dir.nodeid == self.inodes.root() {
            return false;
        }
        match self.read_dir_id(dir) {
            Ok(id) => dir.dir_id.replace(id),
            Err(_) => false,
        }
    }

    /// Reads the ID of directory `dir` from its `cloakfs.dirid`, through the cache.
    fn read_dir_id(&self, dir: &Inode) -> Res<DirId> {
        if dir.kind != crate::inode::Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let fd = dir.fd();
        let absent = |e| match e {
            rustix::io::Errno::NOENT => self.missing_dir_id(dir),
            e => errno(e),
        };
        let st = rustix::fs::statat(fd, DIRID_FILE, AtFlags::SYMLINK_NOFOLLOW).map_err(absent)?;
        let id = self.dir_ids.get_or_read(&st, || -> Res<_> {
            let file = sys::open_internal(fd, DIRID_FILE).map_err(absent)?;
            let st = rustix::fs::fstat(&file).map_err(errno)?;
            let bytes = sys::read_fd_small(file, DIRID_LEN).map_err(|e| sys::io_errno(&e))?;
            let id = parse_dir_id(&bytes).map_err(|e| self.fail(&e, fd, None))?;
            Ok((st, id))
        })?;
        Ok(id)
    }

    /// Reports (once per directory) a directory without its ID file: EIO.
    fn missing_dir_id(&self, dir: &Inode) -> Errno {
        if self.first_report(dir.nodeid, DIRID_FILE.as_bytes()) {
            tracing::error!(
                "{}: directory has no {DIRID_FILE}; its entries cannot be named",
                sys::describe(dir.fd())
            );
        }
        Errno::EIO
    }

    /// Remembers the ID just written into a new directory's ID file `id_file`.
    fn remember_dir_id(&self, id_file: BorrowedFd<'_>, id: DirId) {
        if let Ok(st) = rustix::fs::fstat(id_file) {
            self.dir_ids.insert(&st, id);
        }
    }

    /// The stored form of plaintext `name` inside directory `dir`.
    pub(crate) fn stored_name(&self, dir: &Inode, name: &OsStr) -> Res<StoredName> {
        let id = self.dir_id(dir)?;
        self.volume
            .names()
            .encrypt(&id, name.as_bytes())
            .map_err(|e| Errno::from_i32(e.errno()))
    }

    /// Writes the sidecar of a long name before its entry is created. Returns whether this
    /// call created it (so a failed operation can take it back).
    pub(crate) fn write_sidecar(&self, dir: BorrowedFd<'_>, stored: &StoredName) -> Res<bool> {
        let StoredName::Long { backing, full } = stored else {
            return Ok(false);
        };
        match sys::write_new_durable(
            dir,
            &names::sidecar_name(backing),
            full.as_bytes(),
            SIDECAR_MODE,
        ) {
            Ok(()) => Ok(true),
            // Same name, same hash, same content: it is already the right sidecar.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(sys::io_errno(&e)),
        }
    }

    /// Removes the sidecar of a long name after its entry is gone.
    pub(crate) fn remove_sidecar(&self, dir: BorrowedFd<'_>, stored: &StoredName) {
        let backing = match stored {
            StoredName::Long { backing, .. } => backing,
            // An entry reached by its conflict name: a conflict copy (whose sidecar's copies
            // go with it), or a long name under an ID-file copy (whose sidecar goes).
            StoredName::Short(b) => {
                self.remove_conflict_sidecars(dir, b);
                if !matches!(names::classify(b), names::EntryKind::Long(_)) {
                    return;
                }
                b
            }
        };
        {
            let side = names::sidecar_name(backing);
            if let Err(e) = rustix::fs::unlinkat(dir, side.as_str(), AtFlags::empty()) {
                if e != rustix::io::Errno::NOENT {
                    tracing::warn!(
                        "{}/{side}: cannot remove long-name sidecar: {e}",
                        sys::describe(dir)
                    );
                }
            }
        }
    }

    /// Logs (once per backing entry) that a listed name does not decrypt.
    fn warn_bad_name(&self, dir: &Inode, backing: &[u8], why: &str) {
        if self.first_report(dir.nodeid, backing) {
            tracing::warn!(
                "{}/{}: {why}; not listed",
                sys::describe(dir.fd()),
                String::from_utf8_lossy(backing)
            );
        }
    }

    /// The full encrypted name stored in the sidecar of long entry `backing`.
    pub(crate) fn read_sidecar(dir: BorrowedFd<'_>, backing: &str) -> Result<String, &'static str> {
        let bytes = sys::read_small(dir, &names::sidecar_name(backing), names::SIDECAR_MAX)
            .map_err(|_| "long name without a readable sidecar")?;
        let full = String::from_utf8(bytes).map_err(|_| "long-name sidecar is not text")?;
        let full = full.trim_end().to_string();
        if names::long_backing_name(&full) != backing {
            return Err("long-name sidecar does not match its entry");
        }
        Ok(full)
    }

    /// Decrypts the listing of directory `dir` from backing offset `from` (0: the start): its
    /// entries in backing order, `.` and `..` included, without cloakfs's own files and
    /// without names that fail to decrypt (logged once each). A full listing in which names
    /// exist but none decrypts is EIO. Each entry carries the backing offset that resumes
    /// after it, so offsets stay as stable as the backing file system makes them, across
    /// handles too.
    pub(crate) fn list(&self, dir: &Inode, from: u64) -> Res<Vec<ListEntry>> {
        let adopted = self.adopted();
        let id = self.dir_id_if_any(dir)?;
        let rfd = sys::open_dir(dir.fd()).map_err(errno)?;
        let dev = crate::attr::Meta::of_fd(&rfd).map_err(errno)?.dev;
        if from != 0 {
            rustix::fs::seek(&rfd, rustix::fs::SeekFrom::Start(from)).map_err(errno)?;
        }
        // Each getdents on a network store is a round trip: few and large.
        let mut buf = Vec::with_capacity(LIST_BUFFER);
        let mut d = RawDir::new(&rfd, buf.spare_capacity_mut());
        let dfd = rfd.as_fd();
        let mut out = Vec::new();
        let mut decrypted = 0usize;
        let (mut undecryptable, mut copies) = (Vec::new(), Vec::new());
        let mut conflicts = None;
        while let Some(ent) = d.next() {
            let ent = ent.map_err(errno)?;
            let raw = ent.file_name().to_bytes();
            let next = ent.next_entry_cookie();
            if raw == b"." || raw == b".." {
                out.push(ListEntry {
                    name: OsStr::from_bytes(raw).to_owned(),
                    ino: if raw == b"." {
                        dir.nodeid
                    } else if self.inodes.is_tree() && dir.nodeid == self.inodes.root() {
                        // An attach's parent is the tree root.
                        crate::inode::ROOT
                    } else {
                        self.inodes.number_hint(dev, ent.ino())
                    },
                    kind: FileType::Directory,
                    backing: None,
                    plain: false,
                    next,
                });
                continue;
            }
            let class = self
                .volume
                .names()
                .classify_entry(id.as_ref(), raw, adopted, |b| Self::read_sidecar(dfd, b));
            // A sync client's conflict copy: listed under a name that says so.
            let conflict = match (&class, &id) {
                (Classified::Internal | Classified::Undecryptable(_), Some(id)) => {
                    self.conflict_shown_name(dir, id, dfd, raw, &mut conflicts)
                }
                _ => None,
            };
            let (plain, is_plain) = match class {
                _ if conflict.is_some() => {
                    decrypted += 1;
                    (conflict.unwrap_or_default(), false)
                }
                Classified::Internal => {
                    if !adopted && cloakfs_core::sync_folder::is_dir_id_copy(raw) {
                        copies.push(raw.to_vec());
                    }
                    // Looked at again once the directory's other IDs are known.
                    if !adopted && id.is_some() {
                        undecryptable.push(crate::dir_id_copies::Unnamed {
                            at: out.len(),
                            raw: raw.to_vec(),
                            why: None,
                            ino: ent.ino(),
                            file_type: ent.file_type(),
                            next,
                        });
                    }
                    continue;
                }
                Classified::Encrypted(p) => {
                    decrypted += 1;
                    (p, false)
                }
                Classified::Plain => {
                    let shadowed = id.as_ref().is_some_and(|id| {
                        self.volume.names().encrypt(id, raw).is_ok_and(|s| {
                            rustix::fs::statat(dfd, s.backing(), AtFlags::SYMLINK_NOFOLLOW).is_ok()
                        })
                    });
                    // The encrypted entry of the same name is the one shown; a name that is
                    // not text cannot be served, nor one the tree's manifest does not list.
                    if shadowed
                        || std::str::from_utf8(raw).is_err()
                        || !self.plain_served(id.as_ref(), raw)
                    {
                        continue;
                    }
                    (raw.to_vec(), true)
                }
                Classified::Undecryptable(why) => {
                    // Tried under the directory's other IDs once the listing is read.
                    undecryptable.push(crate::dir_id_copies::Unnamed {
                        at: out.len(),
                        raw: raw.to_vec(),
                        why: Some(why),
                        ino: ent.ino(),
                        file_type: ent.file_type(),
                        next,
                    });
                    continue;
                }
            };
            let name = std::str::from_utf8(raw).map_err(|_| Errno::EIO)?;
            let kind = match kind_of_dirent(ent.file_type()) {
                Some(k) => k,
                None => match rustix::fs::statat(dfd, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => crate::attr::Meta::from_stat(&st)
                        .kind()
                        .unwrap_or(FileType::RegularFile),
                    Err(_) => continue,
                },
            };
            out.push(ListEntry {
                name: OsString::from_vec(plain),
                ino: self.inodes.number_hint(dev, ent.ino()),
                kind,
                backing: Some(name.to_string()),
                plain: is_plain,
                next,
            });
        }
        decrypted += self.name_under_copies(
            dir,
            dfd,
            id.as_ref(),
            from,
            &copies,
            &mut undecryptable,
            &mut out,
            dev,
            &mut conflicts,
        );
        let mut undecryptable_count = 0;
        for u in &undecryptable {
            if let Some(why) = u.why {
                self.warn_bad_name(dir, &u.raw, why);
                undecryptable_count += 1;
            }
        }
        let undecryptable = undecryptable_count;
        if from == 0 && decrypted == 0 && undecryptable > 0 {
            // Not an empty listing: that is what a volume whose config was replaced would
            // show, and the user must see that something is wrong.
            tracing::error!(
                "{}: none of its {undecryptable} entries decrypts (a wrong or replaced volume \
                 config, or a directory from another volume): listing refused with EIO",
                sys::describe(dir.fd())
            );
            return Err(Errno::EIO);
        }
        Ok(out)
    }

    /// Creates backing directory `stored` (plaintext `name`) in `parent`, with the ID derived
    /// from the parent's ID and `name` (FORMAT.md 9.2: two devices making one path agree).
    ///
    /// The directory is built under an internal temporary name: its `cloakfs.dirid` is written
    /// and synced, and the directory synced, before it is renamed to its real name. A crash
    /// can therefore leave an unlisted temporary directory, but never a listed directory
    /// without its ID (gocryptfs #1033 lost directories to an empty `gocryptfs.diriv`).
    /// `owner` is applied before the rename, so no other user ever sees it with our owner.
    pub(crate) fn make_dir(
        &self,
        parent: &Inode,
        name: &OsStr,
        stored: &StoredName,
        mode: u32,
        umask: u32,
        owner: Option<(u32, Option<u32>)>,
    ) -> Res<(OwnedFd, DirId)> {
        let id = self
            .volume
            .new_dir_id(&self.dir_id(parent)?, name.as_bytes());
        let pfd = parent.fd();
        let tmp = format!(
            "{TMP_PREFIX}{}",
            hex(&cloakfs_core::crypto::random::array::<8>())
        );
        // The mode the caller's umask, or the parent's default ACL, gives `mode`.
        let made = sys::with_umask(umask, |mask| {
            rustix::fs::mkdirat(pfd, tmp.as_str(), Mode::from_raw_mode(mode & mask))
        });
        made.map_err(errno)?;
        let built = (|| -> Res<OwnedFd> {
            let st =
                rustix::fs::statat(pfd, tmp.as_str(), AtFlags::SYMLINK_NOFOLLOW).map_err(errno)?;
            let given = crate::attr::Meta::from_stat(&st).mode & 0o7777;
            // Readable, writable and searchable by us until the ID is in place.
            if given & 0o700 != 0o700 {
                rustix::fs::chmodat(
                    pfd,
                    tmp.as_str(),
                    Mode::from_raw_mode(given | 0o700),
                    AtFlags::empty(),
                )
                .map_err(errno)?;
            }
            let dfd = sys::open_subdir_readable(pfd, tmp.as_str()).map_err(errno)?;
            // Made durable after the reply, but before any rename, link or fsync (durable.rs).
            let id_file = sys::write_new(dfd.as_fd(), DIRID_FILE, &id.0, DIRID_MODE, false)
                .map_err(|e| sys::io_errno(&e))?;
            // A directory made below inherits its parent's default recipients.
            if self.codec.key_source().is_wrapped() {
                cloakfs_core::tools::share::inherit_default(
                    &self.volume,
                    std::path::Path::new(&sys::proc_path(pfd)),
                    std::path::Path::new(&sys::proc_path(dfd.as_fd())),
                )
                .map_err(|e| Errno::from_i32(e.errno()))?;
            }
            if let Some((uid, gid)) = owner {
                chown(dfd.as_fd(), DIRID_FILE, uid, gid)?;
                chown(dfd.as_fd(), "", uid, gid)?;
            }
            if given & 0o700 != 0o700 {
                // Back to the mode it was given (a set-group-ID bit inherited from the parent
                // included); a chmod leaves an inherited ACL's entries but the owner's alone.
                let st = crate::attr::Meta::of_fd(&dfd).map_err(errno)?;
                let keep = st.mode & libc::S_ISGID;
                rustix::fs::fchmod(&dfd, Mode::from_raw_mode(given | keep)).map_err(errno)?;
            }
            self.remember_dir_id(id_file.as_fd(), id);
            // Nothing may fail once the directory has its name.
            let sync_job = crate::durable::Job {
                id_file,
                id: id.0,
                dir: rustix::io::fcntl_dupfd_cloexec(&dfd, 0).map_err(errno)?,
            };
            let created = self.write_sidecar(pfd, stored)?;
            let moved = rename_noreplace(pfd, &tmp, stored.backing());
            // Lost to another client's mkdir of the same name: the sidecar is that one's.
            if moved.as_ref().is_err_and(|e| *e != Errno::EEXIST) && created {
                self.remove_sidecar(pfd, stored);
            }
            moved?;
            self.syncer.push(sync_job);
            Ok(dfd)
        })();
        match built {
            Ok(dfd) => Ok((dfd, id)),
            Err(e) => {
                remove_unused_dir(pfd, &tmp);
                Err(e)
            }
        }
    }

    /// Removes backing directory `stored` from `parent` if it holds nothing but cloakfs's own
    /// files.
    pub(crate) fn remove_dir(&self, parent: &Inode, stored: &StoredName) -> Res<()> {
        let pfd = parent.fd();
        self.emptied_then(parent, stored, || {
            rustix::fs::unlinkat(pfd, stored.backing(), AtFlags::REMOVEDIR)
        })?;
        self.remove_sidecar(pfd, stored);
        Ok(())
    }

    /// Runs `op`, which removes or replaces backing directory `stored` of `parent`, once that
    /// directory holds nothing but cloakfs's own files (ENOTEMPTY otherwise). Leftovers of
    /// crashes and files the store's client hid (see [`HIDDEN_PREFIX`]) go first, the
    /// directory ID last; if `op` then fails, the same ID is put back.
    pub(crate) fn emptied_then(
        &self,
        parent: &Inode,
        stored: &StoredName,
        mut op: impl FnMut() -> rustix::io::Result<()>,
    ) -> Res<()> {
        // A directory made a moment ago may still have its ID file open in the sync thread's
        // queue. A store that keeps a removed open file under another name until its close
        // (sshfs's `.fuse_hidden*`, NFS's `.nfs*`) would then leave the directory not empty;
        // libfuse 3.14's sshfs, with the close racing the removal, keeps such a file for good.
        self.syncer.drain()?;
        let dfd = sys::open_subdir_readable(parent.fd(), stored.backing()).map_err(errno)?;
        let mut internal = Vec::new();
        let adopted = self.adopted();
        {
            let mut d = Dir::read_from(&dfd).map_err(errno)?;
            while let Some(ent) = d.read() {
                let ent = ent.map_err(errno)?;
                let raw = ent.file_name().to_bytes();
                if raw == b"." || raw == b".." {
                    continue;
                }
                if raw.starts_with(HIDDEN_PREFIX) {
                    internal.push((raw.to_vec(), ent.file_type()));
                    continue;
                }
                if adopted && !raw.starts_with(names::RESERVED_PREFIX.as_bytes()) {
                    // A plaintext entry of an adopted tree.
                    return Err(Errno::ENOTEMPTY);
                }
                match std::str::from_utf8(raw).map(names::classify) {
                    Ok(EntryKind::Internal) if raw != DIRID_FILE.as_bytes() => {
                        internal.push((raw.to_vec(), ent.file_type()))
                    }
                    Ok(EntryKind::Internal) => {}
                    _ => return Err(Errno::ENOTEMPTY),
                }
            }
        }
        for (name, t) in internal {
            let name = OsStr::from_bytes(&name);
            let r = if t == rustix::fs::FileType::Directory {
                // A directory left by an interrupted mkdir: empty but for its ID.
                if let Ok(t) = open_subdir(dfd.as_fd(), name) {
                    let _ = rustix::fs::unlinkat(&t, DIRID_FILE, AtFlags::empty());
                }
                rustix::fs::unlinkat(&dfd, name, AtFlags::REMOVEDIR)
            } else {
                rustix::fs::unlinkat(&dfd, name, AtFlags::empty())
            };
            match r {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(_) => return Err(Errno::ENOTEMPTY),
            }
        }
        // The ID is kept to be put back if `op` fails. Known, it is not read: a read's close
        // reaches a FUSE store (sshfs) after the removal below, which then races it as above.
        let known = rustix::fs::statat(&dfd, DIRID_FILE, AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .and_then(|st| self.dir_ids.get(&st));
        let saved = match known {
            Some(id) => Some(id.0.to_vec()),
            None => match sys::read_small(dfd.as_fd(), DIRID_FILE, DIRID_LEN) {
                Ok(b) => Some(b),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
                Err(e) => return Err(sys::io_errno(&e)),
            },
        };
        if saved.is_some() {
            rustix::fs::unlinkat(&dfd, DIRID_FILE, AtFlags::empty()).map_err(errno)?;
        }
        let mut attempt = 0;
        let done = loop {
            match op() {
                // The ID file just read and removed (or a file removed just before) may have
                // been hidden, its close still on the way to the store's client.
                Err(rustix::io::Errno::NOTEMPTY | rustix::io::Errno::EXIST)
                    if attempt < HIDDEN_ATTEMPTS && remove_hidden(dfd.as_fd()) =>
                {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(attempt));
                }
                r => break r,
            }
        };
        if let Err(e) = done {
            if let Some(bytes) = saved {
                if let Err(re) = sys::write_new_durable(dfd.as_fd(), DIRID_FILE, &bytes, DIRID_MODE)
                {
                    tracing::error!(
                        "{}: removal failed ({e}) and the directory ID could not be restored: {re}",
                        sys::describe(dfd.as_fd())
                    );
                }
            }
            return Err(errno(e));
        }
        Ok(())
    }
}

/// `chown` of `name` in `dir` (or of `dir` itself for an empty name), never following a
/// symlink; `gid` None keeps the group.
pub(crate) fn chown(dir: BorrowedFd<'_>, name: &str, uid: u32, gid: Option<u32>) -> Res<()> {
    let flags = if name.is_empty() {
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW
    } else {
        AtFlags::SYMLINK_NOFOLLOW
    };
    rustix::fs::chownat(
        dir,
        name,
        Some(rustix::fs::Uid::from_raw(uid)),
        gid.map(rustix::fs::Gid::from_raw),
        flags,
    )
    .map_err(errno)
}

/// Opens subdirectory `name` of `dir` as an `O_PATH` handle.
fn open_subdir<P: rustix::path::Arg>(dir: BorrowedFd<'_>, name: P) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        rustix::fs::OFlags::PATH
            | rustix::fs::OFlags::DIRECTORY
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// The start of the names libfuse's high-level library gives files removed while open
/// (renamed, and removed at their last close), as sshfs does: sshfs 3 has no `hard_remove`.
/// cloakfs closes its own description of a backing file (or its ID file) just before
/// removing it, and the close reaches the store's client later, so a removal here is often
/// such a rename; and when the close arrives during the rename, the hidden file stays for good.
const HIDDEN_PREFIX: &[u8] = b".fuse_hidden";

/// How many times a removal that the store's client's hidden files keep from succeeding is
/// tried (waiting 1, 2, ... ms between).
const HIDDEN_ATTEMPTS: u64 = 20;

/// Removes the files the store's client hid in `dir` (see [`HIDDEN_PREFIX`]); whether there
/// were any and nothing else.
fn remove_hidden(dir: BorrowedFd<'_>) -> bool {
    let Ok(mut d) = Dir::read_from(dir) else {
        return false;
    };
    let mut hidden = Vec::new();
    while let Some(Ok(ent)) = d.read() {
        let raw = ent.file_name().to_bytes();
        if raw.starts_with(HIDDEN_PREFIX) {
            hidden.push(OsStr::from_bytes(raw).to_os_string());
        } else if raw != b"." && raw != b".." {
            return false;
        }
    }
    for name in &hidden {
        // Still open in the store's client: it hides the file again, for the next attempt.
        let _ = rustix::fs::unlinkat(dir, name.as_os_str(), AtFlags::empty());
    }
    !hidden.is_empty()
}

/// Removes directory `tmp` of `parent` that a mkdir built and could not use (it lost a race,
/// or failed), with what is in it: nothing but that mkdir's own files, among them its ID file
/// just closed, which the store's client may hide (see [`HIDDEN_PREFIX`]). So every entry
/// goes, and again while the directory is not empty, a bounded number of times.
fn remove_unused_dir(parent: BorrowedFd<'_>, tmp: &str) {
    for attempt in 1..=HIDDEN_ATTEMPTS {
        if let Ok(t) = sys::open_subdir_readable(parent, tmp) {
            let mut names = Vec::new();
            if let Ok(mut d) = Dir::read_from(&t) {
                while let Some(Ok(ent)) = d.read() {
                    let raw = ent.file_name().to_bytes();
                    if raw != b"." && raw != b".." {
                        names.push(OsStr::from_bytes(raw).to_os_string());
                    }
                }
            }
            for name in names {
                let _ = rustix::fs::unlinkat(&t, name.as_os_str(), AtFlags::empty());
            }
        }
        match rustix::fs::unlinkat(parent, tmp, AtFlags::REMOVEDIR) {
            Err(rustix::io::Errno::NOTEMPTY | rustix::io::Errno::EXIST)
                if attempt < HIDDEN_ATTEMPTS =>
            {
                // The close may still be on its way to the store's client.
                std::thread::sleep(std::time::Duration::from_millis(attempt));
            }
            Ok(()) | Err(rustix::io::Errno::NOENT) => return,
            Err(e) => {
                tracing::warn!(
                    "{}: an unused temporary directory stays ({e}); fsck lists it",
                    sys::describe(parent)
                );
                return;
            }
        }
    }
}

/// Renames `from` to `to` in the same directory, failing with EEXIST if `to` exists.
fn rename_noreplace(dir: BorrowedFd<'_>, from: &str, to: &str) -> Res<()> {
    match rustix::fs::renameat_with(dir, from, dir, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::INVAL) => {
            // The backing file system lacks RENAME_NOREPLACE (e.g. NFS): check, then rename.
            match rustix::fs::statat(dir, to, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(_) => Err(Errno::EEXIST),
                // A directory with entries is never replaced: if another client's (which
                // holds its ID file) took the name meanwhile, the store refuses, in its own
                // words (ENOTEMPTY, or EACCES over SFTP).
                Err(rustix::io::Errno::NOENT) => {
                    rustix::fs::renameat(dir, from, dir, to).map_err(|e| {
                        match rustix::fs::statat(dir, to, AtFlags::SYMLINK_NOFOLLOW) {
                            Ok(_) => Errno::EEXIST,
                            Err(_) => errno(e),
                        }
                    })
                }
                Err(e) => Err(errno(e)),
            }
        }
        Err(e) => Err(errno(e)),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloakfs_core::crypto::kdf::Argon2Params;
    use cloakfs_core::crypto::secret::Passphrase;
    use cloakfs_core::format::config::VolumeParams;
    use cloakfs_core::Volume;
    use fuser::INodeNo;
    use std::os::unix::fs::FileExt;
    use std::sync::OnceLock;
    use std::time::Duration;

    fn served(cipher: &std::path::Path) -> CloakFs {
        let pass = Passphrase::new(b"pw".to_vec());
        let kdf = Argon2Params::LEAST;
        Volume::create(cipher, VolumeParams::new(), &pass, kdf).unwrap();
        let volume = Volume::unlock(cipher, &pass).unwrap();
        CloakFs::new(
            volume,
            cipher,
            Duration::ZERO,
            false,
            Arc::new(OnceLock::new()),
        )
        .unwrap()
    }

    /// The directory's ID as a node the kernel just looked up (after forgetting any other)
    /// sees it.
    fn id_seen_fresh(fs: &CloakFs, name: &str) -> DirId {
        let root = fs.inodes.root();
        let attr = fs.do_lookup(INodeNo(root), OsStr::new(name)).unwrap();
        let node = fs.node(attr.ino).unwrap();
        assert!(node.dir_id.get().is_none(), "a fresh node");
        let id = fs.dir_id(&node).unwrap();
        fs.inodes.forget(attr.ino.0, 1);
        id
    }

    #[test]
    fn forgotten_directories_ids_come_from_the_cache_until_their_file_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = served(tmp.path());
        let root = fs.node(INodeNo(fs.inodes.root())).unwrap();
        let stored = fs.stored_name(&root, OsStr::new("d")).unwrap();
        let (_dfd, made) = fs
            .make_dir(&root, OsStr::new("d"), &stored, 0o755, 0, None)
            .unwrap();
        let file = tmp.path().join(stored.backing()).join(DIRID_FILE);

        // Written by mkdir: known without a read.
        assert_eq!(id_seen_fresh(&fs, "d"), made);
        assert_eq!(fs.dir_ids.reads(), 0);

        // Replaced by another one (as a sync tool renames its download into place): read.
        let other = DirId([7; 16]);
        let tmpfile = tmp.path().join("new-id");
        std::fs::write(&tmpfile, other.0).unwrap();
        std::fs::rename(&tmpfile, &file).unwrap();
        assert_eq!(id_seen_fresh(&fs, "d"), other);
        assert_eq!(fs.dir_ids.reads(), 1);
        // ... once.
        assert_eq!(id_seen_fresh(&fs, "d"), other);
        assert_eq!(fs.dir_ids.reads(), 1);

        // Rewritten in place, times set back as a copy tool would: read again.
        let third = DirId([9; 16]);
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(&third.0, 0).unwrap();
        f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000))
            .unwrap();
        drop(f);
        assert_eq!(id_seen_fresh(&fs, "d"), third);
        assert_eq!(fs.dir_ids.reads(), 2);
        // The names in it are then bound to that ID.
        let node = fs
            .node(
                fs.do_lookup(INodeNo(fs.inodes.root()), OsStr::new("d"))
                    .unwrap()
                    .ino,
            )
            .unwrap();
        let expect = fs.volume.names().encrypt(&third, b"x").unwrap();
        assert_eq!(fs.stored_name(&node, OsStr::new("x")).unwrap(), expect);
    }
}
