//! The conversion engine: walks the cipher directory, counts each atomic step (and aborts
//! after the N-th for the crash tests), batches temporaries for one syncfs. Pass 1 is in
//! `contents`, pass 2 in `names`.

use super::contents::{find_inode, REDO_PREFIX};
use super::{Outcome, Summary};
use crate::error::{Error, Result};
use crate::tools::walk::{is_payload, Progress, REKEY_TEMP_PREFIX};
use crate::volume::Volume;
use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Test hook: abort after this many atomic steps.
pub const CRASH_ENV: &str = "CLOAKFS_REKEY_CRASH_AFTER";
/// Temporaries are made durable and renamed in batches of at most this many files...
pub(super) const BATCH_FILES: usize = 512;
/// ... or this many bytes.
pub(super) const BATCH_BYTES: u64 = 64 << 20;

/// Makes everything written to the cipher directory's file system durable.
pub(super) fn sync_fs(cipherdir: &Path) -> Result<()> {
    rustix::fs::syncfs(File::open(cipherdir)?).map_err(std::io::Error::from)?;
    Ok(())
}

/// The names in directory `dir`, sorted: each pass walks a directory in the same order.
pub(super) fn sorted_names(dir: &Path) -> std::io::Result<Vec<OsString>> {
    let mut names: Vec<OsString> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    Ok(names)
}

pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

pub(super) fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    rustix::fs::renameat_with(
        rustix::fs::CWD,
        from,
        rustix::fs::CWD,
        to,
        rustix::fs::RenameFlags::NOREPLACE,
    )?;
    Ok(())
}

pub(super) fn temp_name() -> String {
    let r: [u8; 8] = crate::crypto::random::array();
    let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
    format!("{REKEY_TEMP_PREFIX}{hex}")
}

/// Which key an entry opens under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Already under the target key (or nothing keyed in it).
    Done,
    /// Still under the source key.
    Todo,
}

pub(super) struct Engine<'a> {
    pub(super) from: &'a Volume,
    pub(super) to: &'a Volume,
    pub(super) root: PathBuf,
    pub(super) progress: &'a dyn Progress,
    pub(super) summary: &'a mut Summary,
    pub(super) crash_after: Option<u64>,
    pub(super) steps: u64,
    pub(super) rollback: bool,
    pub(super) reported: u64,
    pub(super) pending: Vec<(PathBuf, PathBuf)>,
    pub(super) pending_bytes: u64,
    pub(super) plain: Vec<u8>,
    pub(super) sealed: Vec<u8>,
    pub(super) out: Vec<u8>,
}

pub(super) fn tampered_at(what: &Path, m: impl std::fmt::Display) -> Error {
    Error::Tampered(format!("{}: {m}", what.display()))
}

impl<'a> Engine<'a> {
    pub(super) fn new(
        from: &'a Volume,
        to: &'a Volume,
        cipherdir: &Path,
        progress: &'a dyn Progress,
        summary: &'a mut Summary,
    ) -> Self {
        let crash_after = std::env::var(CRASH_ENV).ok().and_then(|v| v.parse().ok());
        let rollback = summary.outcome == Outcome::RolledBack;
        Self {
            from,
            to,
            root: cipherdir.to_path_buf(),
            progress,
            summary,
            crash_after,
            steps: 0,
            rollback,
            reported: 0,
            pending: Vec::new(),
            pending_bytes: 0,
            plain: Vec::new(),
            sealed: Vec::new(),
            out: Vec::new(),
        }
    }

    /// Counts one atomic step (and aborts there if the test hook says so).
    pub(super) fn step(&mut self) {
        self.steps += 1;
        self.summary.steps = self.steps;
        if self.crash_after == Some(self.steps) {
            std::process::abort();
        }
    }

    pub(super) fn check_cancel(&mut self) -> Result<()> {
        if self.progress.cancelled() {
            self.flush()?;
            return Err(Error::Refused(
                "rekey interrupted; the volume is consistent: run `cloakfs rekey --resume` to \
                 finish it or `cloakfs rekey --rollback` to undo it"
                    .into(),
            ));
        }
        Ok(())
    }

    pub(super) fn run(mut self) -> Result<()> {
        let (bytes, entries) = self.prescan()?;
        self.progress.start(bytes, entries);
        self.progress.phase("re-encrypting contents");
        self.contents()?;
        self.flush()?;
        self.progress.phase("re-encrypting names");
        self.names()?;
        Ok(())
    }

    /// Finishes the in-place conversions a crash interrupted (redo files), removes leftover
    /// temporaries, and counts the work.
    pub(super) fn prescan(&mut self) -> Result<(u64, u64)> {
        let mut bytes = 0;
        let mut entries = 0;
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let names = sorted_names(&dir)?;
            let mut removed = false;
            for name in &names {
                let path = dir.join(name);
                if let Some(rest) = name.as_bytes().strip_prefix(REDO_PREFIX.as_bytes()) {
                    let ino = std::str::from_utf8(rest)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok());
                    match ino.and_then(|ino| find_inode(&dir, &names, ino)) {
                        Some(target) => self.apply_redo(&path, &target)?,
                        None => {
                            std::fs::remove_file(&path)?;
                            removed = true;
                        }
                    }
                    self.summary.temporaries_removed += 1;
                    continue;
                }
                if name.as_bytes().starts_with(REKEY_TEMP_PREFIX.as_bytes()) {
                    std::fs::remove_file(&path)?;
                    self.summary.temporaries_removed += 1;
                    removed = true;
                    continue;
                }
                if !is_payload(name) {
                    continue;
                }
                entries += 1;
                let meta = std::fs::symlink_metadata(&path)?;
                if meta.is_dir() {
                    stack.push(path);
                } else if meta.is_file() {
                    bytes += meta.len();
                }
            }
            if removed {
                sync_dir(&dir)?;
            }
        }
        Ok((bytes, entries))
    }
}

pub(super) fn timestamps(meta: &Metadata) -> rustix::fs::Timestamps {
    let ts = |s: i64, ns: i64| rustix::fs::Timespec {
        tv_sec: s,
        tv_nsec: ns as _,
    };
    rustix::fs::Timestamps {
        last_access: ts(meta.atime(), meta.atime_nsec()),
        last_modification: ts(meta.mtime(), meta.mtime_nsec()),
    }
}

/// Makes `[off, off + len)` of `f` a hole (or zeros where the file system cannot punch).
pub(super) fn punch_hole(f: &File, off: u64, len: u64) -> std::io::Result<()> {
    use rustix::fs::FallocateFlags as F;
    match rustix::fs::fallocate(f, F::PUNCH_HOLE | F::KEEP_SIZE, off, len) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP) | Err(rustix::io::Errno::NOSYS) => {
            f.write_all_at(&vec![0u8; len as usize], off)
        }
        Err(e) => Err(e.into()),
    }
}
