//! Copying the whole plaintext tree out of a volume without a mount (disaster recovery).
//!
//! Files (with permission bits, times and decrypted `user.` xattrs, hard links kept), directories,
//! symlinks and fifos are recreated under the destination, and an adopted tree's plaintext
//! entries copied as they are; sockets and devices are skipped with a note. Anything unreadable (a file with a tampered block, a name that does not decrypt, a
//! directory without its `cloakfs.dirid`) is skipped and listed; nothing unauthenticated is
//! ever written out: a file that fails part-way is removed from the destination again.

use crate::error::{Error, Result};
use crate::tools::blocks::{BlockReader, CHUNK_BLOCKS};
use crate::tools::walk::{display_plain, EntryType, InternalKind, Item, Progress, Walker};
use crate::volume::Volume;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, FileTimes, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// An entry that was not exported.
#[derive(Debug, Clone)]
pub struct Skipped {
    /// Where it is in the volume (plaintext path if known).
    pub location: String,
    /// Why.
    pub reason: String,
}

/// What an export did.
#[derive(Debug, Clone, Default)]
pub struct ExportReport {
    /// Regular files written.
    pub files: u64,
    /// Directories created (not counting the destination itself).
    pub directories: u64,
    /// Symlinks created.
    pub symlinks: u64,
    /// Fifos created.
    pub fifos: u64,
    /// Names made as hard links of a file already written.
    pub hard_links: u64,
    /// Plaintext bytes written.
    pub bytes: u64,
    /// Unreadable entries (the export is incomplete if there is any).
    pub skipped: Vec<Skipped>,
    /// Things deliberately left out (sockets, devices, foreign files, xattrs the destination
    /// does not take).
    pub notes: Vec<String>,
}

/// Checks that `dest` may receive an export (missing, or an empty directory, and not inside
/// the cipher directory) and creates it.
pub fn prepare_destination(cipherdir: &Path, dest: &Path) -> Result<()> {
    match std::fs::read_dir(dest) {
        Ok(mut rd) => {
            if rd.next().is_some() {
                return Err(Error::Refused(format!(
                    "{} is not empty: export needs a new or empty directory",
                    dest.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().mode(0o700).create(dest)?;
        }
        Err(e) => {
            return Err(Error::Io(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", dest.display()),
            )))
        }
    }
    let d = std::fs::canonicalize(dest)?;
    let c = std::fs::canonicalize(cipherdir)?;
    if d.starts_with(&c) {
        let _ = std::fs::remove_dir(dest);
        return Err(Error::Refused(
            "the destination may not lie inside the cipher directory".into(),
        ));
    }
    Ok(())
}

struct Exporter<'a> {
    volume: &'a Volume,
    /// The cipher directory (long symlink targets live in its root).
    cipherdir: PathBuf,
    dest: PathBuf,
    report: ExportReport,
    links: HashMap<(u64, u64), PathBuf>,
    dirs: Vec<(PathBuf, Metadata)>,
    root: bool,
    xattr_note: bool,
    progress: &'a dyn Progress,
    out: Vec<u8>,
    sealed: Vec<u8>,
}

/// Exports the plaintext tree of the volume at `cipherdir` into `dest` (see the module
/// documentation). `dest` must be missing or an empty directory.
pub fn export(
    volume: &Volume,
    cipherdir: &Path,
    dest: &Path,
    progress: &dyn Progress,
) -> Result<ExportReport> {
    crate::tools::rekey::check_not_rekeying(cipherdir)?;
    prepare_destination(cipherdir, dest)?;
    let (bytes, entries) = crate::tools::walk::totals(cipherdir);
    progress.start(bytes, entries);
    let mut x = Exporter {
        volume,
        cipherdir: cipherdir.to_path_buf(),
        dest: dest.to_path_buf(),
        report: ExportReport::default(),
        links: HashMap::new(),
        dirs: Vec::new(),
        root: rustix::process::geteuid().is_root(),
        xattr_note: false,
        progress,
        out: Vec::new(),
        sealed: Vec::new(),
    };
    for item in Walker::new(volume, cipherdir) {
        match item {
            Item::Entry(e) => {
                progress.advance(0, u64::from(!e.is_root()));
                let target = x.dest.join(&e.plain);
                let res = match e.kind {
                    EntryType::Dir => x.dir(&e.backing, &target, &e.meta, e.is_root()),
                    EntryType::File => x.file(&e.backing, &target, &e.meta),
                    EntryType::Symlink => x.symlink(&e.backing, &target, &e.meta),
                    EntryType::Fifo => x.fifo(&e.backing, &target, &e.meta),
                    other => {
                        x.report.notes.push(format!(
                            "{}: {} not exported",
                            display_plain(&e.plain),
                            other.name()
                        ));
                        Ok(())
                    }
                };
                if let Err(reason) = res {
                    x.report.skipped.push(Skipped {
                        location: display_plain(&e.plain),
                        reason,
                    });
                }
            }
            Item::Internal(i) => {
                if i.kind == InternalKind::Plaintext {
                    let plain = i.dir_plain.join(i.backing.file_name().unwrap_or_default());
                    progress.advance(0, 1);
                    if let Err(reason) = x.plain_entry(&i.backing, &x.dest.join(&plain)) {
                        x.report.skipped.push(Skipped {
                            location: display_plain(&plain),
                            reason,
                        });
                    }
                } else if i.kind == InternalKind::PlaintextUnlisted {
                    x.report.notes.push(format!(
                        "{}: plaintext entry {} that the adopted tree's manifest does not list \
                         not exported",
                        display_plain(&i.dir_plain),
                        i.backing.file_name().unwrap_or_default().to_string_lossy()
                    ));
                } else if i.kind == InternalKind::Foreign {
                    x.report.notes.push(format!(
                        "{}: foreign file {} (not made by cloakfs) not exported",
                        display_plain(&i.dir_plain),
                        i.backing.file_name().unwrap_or_default().to_string_lossy()
                    ));
                }
            }
            Item::Bad(b) => {
                let reason = if b.entries > 0 {
                    format!("{}: its {} entries cannot be exported", b.detail, b.entries)
                } else {
                    b.detail.clone()
                };
                x.report.skipped.push(Skipped {
                    location: b.location(),
                    reason,
                });
            }
        }
    }
    // Directory modes and times last (deepest first): writing into a directory changes its
    // mtime, and a read-only mode would stop the writes.
    let mut dirs = std::mem::take(&mut x.dirs);
    dirs.sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
    for (p, meta) in dirs {
        let res =
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
                .and_then(|()| set_times_nofollow(&p, &meta));
        if let Err(e) = res {
            x.report
                .notes
                .push(format!("{}: mode or times not set: {e}", p.display()));
        }
    }
    Ok(x.report)
}

impl Exporter<'_> {
    fn dir(
        &mut self,
        backing: &Path,
        target: &Path,
        meta: &Metadata,
        is_root: bool,
    ) -> std::result::Result<(), String> {
        if !is_root {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(target)
                .map_err(|e| format!("cannot create directory: {e}"))?;
            self.report.directories += 1;
            self.owner(target, meta);
        }
        self.xattrs(backing, target);
        self.dirs.push((target.to_path_buf(), meta.clone()));
        Ok(())
    }

    fn file(
        &mut self,
        backing: &Path,
        target: &Path,
        meta: &Metadata,
    ) -> std::result::Result<(), String> {
        let key = (meta.dev(), meta.ino());
        if meta.nlink() > 1 {
            if let Some(first) = self.links.get(&key) {
                std::fs::hard_link(first, target).map_err(|e| format!("cannot link: {e}"))?;
                self.report.hard_links += 1;
                return Ok(());
            }
        }
        let res = self.copy_file(backing, target, meta);
        if res.is_err() {
            let _ = std::fs::remove_file(target);
        } else {
            self.report.files += 1;
            if meta.nlink() > 1 {
                self.links.insert(key, target.to_path_buf());
            }
        }
        res
    }

    fn copy_file(
        &mut self,
        backing: &Path,
        target: &Path,
        meta: &Metadata,
    ) -> std::result::Result<(), String> {
        use std::os::unix::fs::FileExt;
        let src = File::open(backing).map_err(|e| e.to_string())?;
        let r = BlockReader::open(self.volume.content(), src).map_err(|e| e.to_string())?;
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(target)
            .map_err(|e| format!("cannot create: {e}"))?;
        let bs = r.layout().block_size();
        let mut first = 0;
        while first < r.block_count() {
            let chunk = r
                .read_chunk(first, CHUNK_BLOCKS, &mut self.out, &mut self.sealed)
                .map_err(|e| e.to_string())?;
            if let Some(b) = chunk.first_failure() {
                return Err(format!(
                    "block {b} fails authentication (tampered or damaged); `cloakfs cat` recovers \
                     the {} bytes before it",
                    b * bs
                ));
            }
            // Holes stay holes: skip writing all-zero blocks that were holes.
            let mut off = 0usize;
            for (i, s) in chunk.states.iter().enumerate() {
                let len = r.layout().block_len(first + i as u64, r.size()) as usize;
                if *s != crate::tools::blocks::BlockState::Hole {
                    out.write_all_at(&self.out[off..off + len], (first + i as u64) * bs)
                        .map_err(|e| format!("cannot write: {e}"))?;
                }
                off += len;
            }
            self.progress.advance(self.sealed.len() as u64, 0);
            first += chunk.states.len() as u64;
        }
        if let Some(d) = r.damage() {
            return Err(d);
        }
        out.set_len(r.size())
            .map_err(|e| format!("cannot write: {e}"))?;
        self.report.bytes += r.size();
        self.owner(target, meta);
        out.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(|e| format!("cannot set mode: {e}"))?;
        self.xattrs(backing, target);
        out.set_times(
            FileTimes::new()
                .set_accessed(atime(meta))
                .set_modified(mtime(meta)),
        )
        .map_err(|e| format!("cannot set times: {e}"))?;
        Ok(())
    }

    /// A plaintext entry of an adopted tree, copied as it is (its entries come as items of
    /// their own).
    fn plain_entry(&mut self, backing: &Path, target: &Path) -> std::result::Result<(), String> {
        let meta = std::fs::symlink_metadata(backing).map_err(|e| e.to_string())?;
        let kind = meta.file_type();
        if kind.is_dir() {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(target)
                .map_err(|e| format!("cannot create directory: {e}"))?;
            self.report.directories += 1;
            self.owner(target, &meta);
            self.dirs.push((target.to_path_buf(), meta));
        } else if kind.is_file() {
            let copied = std::fs::copy(backing, target).map_err(|e| format!("cannot copy: {e}"));
            let n = copied.inspect_err(|_| {
                let _ = std::fs::remove_file(target);
            })?;
            self.report.files += 1;
            self.report.bytes += n;
            self.progress.advance(n, 0);
            self.owner(target, &meta);
            self.plain_xattrs(backing, target);
            let _ = set_times_nofollow(target, &meta);
        } else if kind.is_symlink() {
            let t = std::fs::read_link(backing).map_err(|e| e.to_string())?;
            std::os::unix::fs::symlink(t, target)
                .map_err(|e| format!("cannot create symlink: {e}"))?;
            self.owner(target, &meta);
            let _ = set_times_nofollow(target, &meta);
            self.report.symlinks += 1;
        } else {
            self.report.notes.push(format!(
                "{}: special file of an adopted tree not exported",
                target.display()
            ));
        }
        Ok(())
    }

    fn symlink(
        &mut self,
        backing: &Path,
        target: &Path,
        meta: &Metadata,
    ) -> std::result::Result<(), String> {
        let stored = std::fs::read_link(backing).map_err(|e| e.to_string())?;
        let t = crate::io::long_targets::read_target_at(
            self.volume.meta(),
            &self.cipherdir,
            stored.as_os_str().as_bytes(),
        )
        .map_err(|e| format!("symlink target: {e}"))?;
        std::os::unix::fs::symlink(OsStr::from_bytes(&t), target)
            .map_err(|e| format!("cannot create symlink: {e}"))?;
        self.owner(target, meta);
        let _ = set_times_nofollow(target, meta);
        self.report.symlinks += 1;
        Ok(())
    }

    fn fifo(
        &mut self,
        backing: &Path,
        target: &Path,
        meta: &Metadata,
    ) -> std::result::Result<(), String> {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            target,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(meta.mode() & 0o7777),
            0,
        )
        .map_err(|e| format!("cannot create fifo: {e}"))?;
        self.owner(target, meta);
        let _ = std::fs::set_permissions(
            target,
            std::fs::Permissions::from_mode(meta.mode() & 0o7777),
        );
        self.xattrs(backing, target);
        let _ = set_times_nofollow(target, meta);
        self.report.fifos += 1;
        Ok(())
    }

    /// Copies the owner when running as root (as `cp -p`); otherwise the files are the user's.
    fn owner(&mut self, target: &Path, meta: &Metadata) {
        if self.root {
            let _ = std::os::unix::fs::lchown(target, Some(meta.uid()), Some(meta.gid()));
        }
    }

    /// Copies a plaintext entry's `user.` xattrs as they are (they were never encrypted).
    fn plain_xattrs(&mut self, backing: &Path, target: &Path) {
        let Ok(names) = crate::io::xattrs::list(backing) else {
            return;
        };
        for name in names.iter().filter(|n| crate::io::xattrs::is_user(n)) {
            let copied = crate::io::xattrs::get(backing, name)
                .and_then(|v| crate::io::xattrs::set(target, name, &v));
            if let Err(e) = copied {
                self.report.notes.push(format!(
                    "{}: xattr {} not copied: {e}",
                    target.display(),
                    String::from_utf8_lossy(name)
                ));
            }
        }
    }

    /// Copies the decrypted `user.` xattrs (others, such as ACLs, are not copied).
    fn xattrs(&mut self, backing: &Path, target: &Path) {
        let Ok(names) = crate::io::xattrs::list(backing) else {
            return;
        };
        let suite = self.volume.content().suite();
        for stored in names
            .iter()
            .filter(|n| crate::io::xattrs::is_user(n) && !suite.is_header_xattr(n))
        {
            let meta = self.volume.meta();
            let (Ok(name), Ok(value)) = (
                meta.decrypt_xattr_name(stored),
                crate::io::xattrs::get(backing, stored)
                    .map_err(Error::from)
                    .and_then(|v| meta.decrypt_xattr_value(stored, &v)),
            ) else {
                self.report.notes.push(format!(
                    "{}: an xattr does not decrypt and was not copied",
                    target.display()
                ));
                continue;
            };
            if let Err(e) = crate::io::xattrs::set(target, &name, &value) {
                if !self.xattr_note {
                    self.xattr_note = true;
                    self.report.notes.push(format!(
                        "xattrs not copied: the destination does not take them ({e})"
                    ));
                }
            }
        }
    }
}

fn atime(m: &Metadata) -> SystemTime {
    system_time(m.atime(), m.atime_nsec())
}

fn mtime(m: &Metadata) -> SystemTime {
    system_time(m.mtime(), m.mtime_nsec())
}

fn system_time(secs: i64, nsec: i64) -> SystemTime {
    let d = Duration::new(secs.unsigned_abs(), nsec.clamp(0, 999_999_999) as u32);
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + d
    } else {
        SystemTime::UNIX_EPOCH - d
    }
}

/// The access and modification times of `meta`, as the `utimensat` family takes them.
pub(crate) fn timestamps(meta: &Metadata) -> rustix::fs::Timestamps {
    let ts = |s: i64, ns: i64| rustix::fs::Timespec {
        tv_sec: s,
        tv_nsec: ns as _,
    };
    rustix::fs::Timestamps {
        last_access: ts(meta.atime(), meta.atime_nsec()),
        last_modification: ts(meta.mtime(), meta.mtime_nsec()),
    }
}

/// Sets access and modification time of `p` from `meta` without following a symlink.
pub(crate) fn set_times_nofollow(p: &Path, meta: &Metadata) -> std::io::Result<()> {
    let times = timestamps(meta);
    rustix::fs::utimensat(
        rustix::fs::CWD,
        p,
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}
