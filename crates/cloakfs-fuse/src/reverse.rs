//! The reverse view: a read-only file system that shows a plaintext directory as the cipher
//! directory of an ordinary volume, encrypted on the fly and deterministically (the bytes
//! come from `cloakfs_core::io::reverse`; docs/FORMAT.md section 17). A thin adapter: it
//! maps names and offsets to core calls and never writes.
//!
//! Nodes are plaintext paths relative to the plaintext directory, plus the view's own files:
//! `cloakfs.conf` in the root, `cloakfs.dirid` in every other directory and the sidecars of
//! long names. Every plaintext path is opened beneath the plaintext directory's descriptor
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so a symlink in the tree is shown
//! as an (encrypted) symlink and never followed out of it.

use crate::attr::{self, Meta};
use crate::sys;
use cloakfs_core::format::config::CONFIG_FILE;
use cloakfs_core::format::names::{
    self, sidecar_name, EntryKind, StoredName, DIRID_FILE, LONG_SIDECAR_SUFFIX,
};
use cloakfs_core::format::reverse::child_path;
use cloakfs_core::io::reverse::ReverseView;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// What a node of the view is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    /// The plaintext entry at this relative path (the root: empty), shown encrypted.
    Entry(Vec<u8>),
    /// `cloakfs.conf` in the root.
    Config,
    /// `cloakfs.dirid` of the directory at this relative path.
    DirId(Vec<u8>),
    /// The sidecar of the long name of plaintext entry (directory path, name).
    Sidecar(Vec<u8>, Vec<u8>),
}

struct Node {
    key: Key,
    lookups: u64,
}

#[derive(Default)]
struct Nodes {
    by_ino: HashMap<u64, Node>,
    by_key: HashMap<Key, u64>,
    next: u64,
}

/// An open file: a plaintext file and the size the view showed for it, or a view's own file.
enum Handle {
    File {
        file: std::fs::File,
        rel: Vec<u8>,
        plain_size: u64,
    },
    Bytes(Arc<[u8]>),
    Dir(Vec<(Vec<u8>, FileType)>),
}

/// The reverse view of one plaintext directory.
pub(crate) struct ReverseFs {
    view: ReverseView,
    root: OwnedFd,
    /// The config, shown as `cloakfs.conf` in the root.
    config: Arc<[u8]>,
    /// The config file's modification time (seconds, nanoseconds): the times of the view's
    /// own files (see `virtual_attr`).
    config_time: (i64, i64),
    /// The relative path of the reverse config if it lies inside the plaintext directory:
    /// never shown.
    hidden: Option<Vec<u8>>,
    /// Per directory (relative path): each long backing name and the plaintext name behind
    /// it, so that a lookup does not encrypt the whole directory again. Rebuilt on a miss
    /// (the plaintext may have changed); at most [`LONG_NAME_DIRS`] directories are kept.
    long_names: Mutex<HashMap<Vec<u8>, LongNames>>,
    nodes: Mutex<Nodes>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    ttl: Duration,
}

type Res<T> = Result<T, Errno>;

/// How many directories' long names [`ReverseFs`] remembers (a backup walks one directory at a
/// time, so a few suffice).
const LONG_NAME_DIRS: usize = 64;

/// The long backing names of one directory and the plaintext name behind each.
type LongNames = HashMap<String, Vec<u8>>;

fn core_errno(e: cloakfs_core::Error) -> Errno {
    Errno::from_i32(e.errno())
}

impl ReverseFs {
    pub(crate) fn new(
        view: ReverseView,
        root: OwnedFd,
        config: Vec<u8>,
        config_time: SystemTime,
        hidden: Option<Vec<u8>>,
        ttl: Duration,
    ) -> Self {
        let mut nodes = Nodes {
            next: 2,
            ..Default::default()
        };
        nodes.by_ino.insert(
            1,
            Node {
                key: Key::Entry(Vec::new()),
                lookups: 1,
            },
        );
        nodes.by_key.insert(Key::Entry(Vec::new()), 1);
        Self {
            view,
            root,
            config: config.into(),
            config_time: attr::seconds_and_nanos(config_time),
            hidden,
            long_names: Mutex::new(HashMap::new()),
            nodes: Mutex::new(nodes),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            ttl,
        }
    }

    fn key(&self, ino: INodeNo) -> Res<Key> {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        nodes
            .by_ino
            .get(&ino.0)
            .map(|n| n.key.clone())
            .ok_or(Errno::ESTALE)
    }

    /// The node number of `key`, counting one more kernel lookup of it.
    fn remember(&self, key: Key) -> u64 {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&ino) = nodes.by_key.get(&key) {
            if let Some(n) = nodes.by_ino.get_mut(&ino) {
                n.lookups += 1;
            }
            return ino;
        }
        let ino = nodes.next;
        nodes.next += 1;
        nodes.by_key.insert(key.clone(), ino);
        nodes.by_ino.insert(ino, Node { key, lookups: 1 });
        ino
    }

    /// Opens the plaintext entry at `rel` beneath the root, never through a symlink.
    fn open_rel(&self, rel: &[u8], flags: OFlags) -> Res<OwnedFd> {
        let path: &[u8] = if rel.is_empty() { b"." } else { rel };
        rustix::fs::openat2(
            self.root.as_fd(),
            OsStr::from_bytes(path),
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(sys::errno)
    }

    fn lstat(&self, rel: &[u8]) -> Res<(OwnedFd, Meta)> {
        let fd = self.open_rel(rel, OFlags::PATH)?;
        let st = rustix::fs::fstat(&fd).map_err(sys::errno)?;
        Ok((fd, Meta::from_stat(&st)))
    }

    fn readlink(&self, rel: &[u8], fd: &OwnedFd) -> Res<String> {
        let target = rustix::fs::readlinkat(fd, "", Vec::new()).map_err(sys::errno)?;
        self.view
            .symlink_target(rel, target.as_bytes())
            .map_err(core_errno)
    }

    /// The attributes of `key` as node `ino`.
    fn attr(&self, ino: u64, key: &Key) -> Res<FileAttr> {
        match key {
            Key::Entry(rel) => {
                let (fd, m) = self.lstat(rel)?;
                let size = match m.kind() {
                    Some(FileType::RegularFile) => self.view.file_size(m.size),
                    Some(FileType::Symlink) => self.readlink(rel, &fd)?.len() as u64,
                    _ => m.size,
                };
                Ok(attr::file_attr(ino, &m, size))
            }
            Key::Config => self.virtual_attr(ino, b"", self.config.len() as u64),
            Key::DirId(dir) => self.virtual_attr(ino, dir, 16),
            Key::Sidecar(dir, name) => {
                let len = match self.stored(dir, name)? {
                    StoredName::Long { full, .. } => full.len() as u64,
                    StoredName::Short(_) => return Err(Errno::ENOENT),
                };
                self.virtual_attr(ino, dir, len)
            }
        }
    }

    /// A read-only regular file of `size` bytes, owned like directory `dir`, timed like the
    /// config: its bytes depend only on its path (the config, a directory's ID derived from
    /// the directory's path, a long name's full form), so a backup tool that compares sizes
    /// and times copies it once, not again after each change in its directory.
    fn virtual_attr(&self, ino: u64, dir: &[u8], size: u64) -> Res<FileAttr> {
        let (_, mut m) = self.lstat(dir)?;
        m.mode = libc::S_IFREG | (m.mode & 0o444);
        (m.atime, m.mtime, m.ctime) = (self.config_time, self.config_time, self.config_time);
        m.nlink = 1;
        m.blocks = size.div_ceil(512);
        Ok(attr::file_attr(ino, &m, size))
    }

    fn stored(&self, dir: &[u8], name: &[u8]) -> Res<StoredName> {
        self.view.stored_name(dir, name).map_err(core_errno)
    }

    fn is_hidden(&self, rel: &[u8]) -> bool {
        self.hidden.as_deref() == Some(rel)
    }

    /// The plaintext names of the directory at `dir`, without `.`, `..` and the hidden config.
    fn plain_names(&self, dir: &[u8]) -> Res<Vec<(Vec<u8>, Option<FileType>)>> {
        let fd = self.open_rel(dir, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let it = rustix::fs::Dir::read_from(&fd).map_err(sys::errno)?;
        let mut out = Vec::new();
        for e in it {
            let e = e.map_err(sys::errno)?;
            let name = e.file_name().to_bytes();
            if name == b"." || name == b".." || self.is_hidden(&child_path(dir, name)) {
                continue;
            }
            let kind = match e.file_type() {
                rustix::fs::FileType::RegularFile => Some(FileType::RegularFile),
                rustix::fs::FileType::Directory => Some(FileType::Directory),
                rustix::fs::FileType::Symlink => Some(FileType::Symlink),
                rustix::fs::FileType::Fifo => Some(FileType::NamedPipe),
                rustix::fs::FileType::Socket => Some(FileType::Socket),
                rustix::fs::FileType::CharacterDevice => Some(FileType::CharDevice),
                rustix::fs::FileType::BlockDevice => Some(FileType::BlockDevice),
                _ => None,
            };
            out.push((name.to_vec(), kind));
        }
        Ok(out)
    }

    /// The plaintext name whose long stored name is `backing` in the directory at `dir`.
    fn long_name_owner(&self, dir: &[u8], backing: &str) -> Res<Vec<u8>> {
        let cached = |m: &HashMap<Vec<u8>, LongNames>| {
            m.get(dir).and_then(|names| names.get(backing)).cloned()
        };
        if let Some(plain) = cached(&self.long_names.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(plain);
        }
        let mut names = HashMap::new();
        for (name, _) in self.plain_names(dir)? {
            // Only names longer than this can be long: a cheap filter before encrypting.
            if name.len() < 16 {
                continue;
            }
            if let Ok(StoredName::Long { backing: b, .. }) = self.view.stored_name(dir, &name) {
                names.insert(b, name);
            }
        }
        let mut all = self.long_names.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() >= LONG_NAME_DIRS {
            all.clear();
        }
        all.insert(dir.to_vec(), names);
        cached(&all).ok_or(Errno::ENOENT)
    }

    /// The node `name` of directory `dir` stands for.
    fn resolve(&self, dir: &[u8], name: &[u8]) -> Res<Key> {
        let name = std::str::from_utf8(name).map_err(|_| Errno::ENOENT)?;
        if name == CONFIG_FILE && dir.is_empty() {
            return Ok(Key::Config);
        }
        if name == DIRID_FILE && !dir.is_empty() {
            return Ok(Key::DirId(dir.to_vec()));
        }
        if let Some(entry) = name.strip_suffix(LONG_SIDECAR_SUFFIX) {
            if let EntryKind::Long(_) = names::classify(entry) {
                let plain = self.long_name_owner(dir, entry)?;
                return Ok(Key::Sidecar(dir.to_vec(), plain));
            }
        }
        let plain = match names::classify(name) {
            EntryKind::Encrypted(s) => self.view.plain_name(dir, s).map_err(|_| Errno::ENOENT)?,
            EntryKind::Long(b) => self.long_name_owner(dir, b)?,
            EntryKind::Internal => return Err(Errno::ENOENT),
        };
        let rel = child_path(dir, &plain);
        if self.is_hidden(&rel) {
            return Err(Errno::ENOENT);
        }
        Ok(Key::Entry(rel))
    }

    fn do_lookup(&self, parent: INodeNo, name: &OsStr) -> Res<FileAttr> {
        let Key::Entry(dir) = self.key(parent)? else {
            return Err(Errno::ENOTDIR);
        };
        let key = self.resolve(&dir, name.as_bytes())?;
        // Checked before the node is counted, so a missing entry leaves no node behind.
        let attr = self.attr(0, &key)?;
        let ino = self.remember(key);
        Ok(FileAttr {
            ino: INodeNo(ino),
            ..attr
        })
    }

    fn bytes_of(&self, key: &Key) -> Res<Arc<[u8]>> {
        Ok(match key {
            Key::Config => self.config.clone(),
            Key::DirId(dir) => Arc::from(&self.view.dir_id_bytes(dir)[..]),
            Key::Sidecar(dir, name) => match self.stored(dir, name)? {
                StoredName::Long { full, .. } => Arc::from(full.as_bytes()),
                StoredName::Short(_) => return Err(Errno::ENOENT),
            },
            Key::Entry(_) => return Err(Errno::EISDIR),
        })
    }

    fn do_open(&self, ino: INodeNo, flags: i32) -> Res<u64> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(Errno::EROFS);
        }
        let key = self.key(ino)?;
        let handle = match &key {
            Key::Entry(rel) => {
                let fd = self.open_rel(rel, OFlags::RDONLY)?;
                let st = rustix::fs::fstat(&fd).map_err(sys::errno)?;
                if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                    return Err(Errno::EINVAL);
                }
                Handle::File {
                    file: std::fs::File::from(fd),
                    rel: rel.clone(),
                    plain_size: u64::try_from(st.st_size).unwrap_or(0),
                }
            }
            other => Handle::Bytes(self.bytes_of(other)?),
        };
        Ok(self.insert_handle(handle))
    }

    fn insert_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, h);
        fh
    }

    fn do_read(&self, fh: FileHandle, off: u64, size: u32) -> Res<Vec<u8>> {
        let handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        match handles.get(&fh.0) {
            Some(Handle::File {
                file,
                rel,
                plain_size,
            }) => {
                let file = file.try_clone().map_err(|e| sys::io_errno(&e))?;
                let (rel, plain_size) = (rel.clone(), *plain_size);
                drop(handles);
                self.view
                    .file(&rel)
                    .read(&file, plain_size, off, size as usize)
                    .map_err(|e| {
                        tracing::warn!("reverse view: a read of a plaintext file failed: {e}");
                        core_errno(e)
                    })
            }
            Some(Handle::Bytes(b)) => {
                let start = (off as usize).min(b.len());
                let end = start.saturating_add(size as usize).min(b.len());
                Ok(b[start..end].to_vec())
            }
            _ => Err(Errno::EBADF),
        }
    }

    /// The listing of the directory at `dir`: its own files, then each plaintext entry's
    /// stored name (and sidecar).
    fn listing(&self, dir: &[u8]) -> Res<Vec<(Vec<u8>, FileType)>> {
        let mut out = vec![
            (b".".to_vec(), FileType::Directory),
            (b"..".to_vec(), FileType::Directory),
        ];
        if dir.is_empty() {
            out.push((CONFIG_FILE.as_bytes().to_vec(), FileType::RegularFile));
        } else {
            out.push((DIRID_FILE.as_bytes().to_vec(), FileType::RegularFile));
        }
        for (name, kind) in self.plain_names(dir)? {
            let kind = match kind {
                Some(k) => k,
                None => match self.lstat(&child_path(dir, &name)) {
                    Ok((_, m)) => m.kind().unwrap_or(FileType::RegularFile),
                    Err(_) => continue,
                },
            };
            // A name no volume can hold (over 255 bytes cannot happen on Linux) is skipped.
            let Ok(stored) = self.view.stored_name(dir, &name) else {
                continue;
            };
            if let StoredName::Long { backing, .. } = &stored {
                out.push((sidecar_name(backing).into_bytes(), FileType::RegularFile));
            }
            out.push((stored.backing().as_bytes().to_vec(), kind));
        }
        Ok(out)
    }
}

impl Filesystem for ReverseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Listings are plain readdir: the kernel looks each name up, which counts its node.
        crate::ops::negotiate_except(
            config,
            crate::ops::WriteCache::WriteThrough,
            false,
            fuser::InitFlags::empty(),
            crate::ops::READDIRPLUS,
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.do_lookup(parent, name) {
            Ok(attr) => reply.entry(&self.ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if ino.0 == 1 {
            return;
        }
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let gone = match nodes.by_ino.get_mut(&ino.0) {
            Some(n) => {
                n.lookups = n.lookups.saturating_sub(nlookup);
                n.lookups == 0
            }
            None => false,
        };
        if gone {
            if let Some(n) = nodes.by_ino.remove(&ino.0) {
                nodes.by_key.remove(&n.key);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.key(ino).and_then(|k| self.attr(ino.0, &k)) {
            Ok(attr) => reply.attr(&self.ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = self.key(ino).and_then(|k| match k {
            Key::Entry(rel) => {
                let (fd, _) = self.lstat(&rel)?;
                self.readlink(&rel, &fd)
            }
            _ => Err(Errno::EINVAL),
        });
        match r {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.do_open(ino, flags.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.do_read(fh, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let r = self.key(ino).and_then(|k| match k {
            Key::Entry(dir) => self.listing(&dir),
            _ => Err(Errno::ENOTDIR),
        });
        match r {
            Ok(list) => reply.opened(
                FileHandle(self.insert_handle(Handle::Dir(list))),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Handle::Dir(list)) = handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (name, kind)) in list.iter().enumerate().skip(offset as usize) {
            // The kernel learns node numbers from lookups; listings carry none of ours.
            if reply.add(
                INodeNo(u64::MAX),
                i as u64 + 1,
                *kind,
                OsStr::from_bytes(name),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match rustix::fs::fstatvfs(&self.root) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                0,
                0,
                s.f_files,
                0,
                s.f_bsize as u32,
                names::NAME_MAX as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(sys::errno(e)),
        }
    }
}
