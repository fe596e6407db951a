//! Sync clients' conflict copies of backing entries (see `cloakfs_core::sync_folder`): each
//! is listed under a readable name that says what it is, and that name looks up, opens,
//! renames and removes the copy's backing entry. Ordinary lookups pay nothing: only a name
//! of the shown shape whose encrypted form is absent makes a scan of the backing directory.

use crate::fs::CloakFs;
use crate::inode::Inode;
use crate::sys::{self, Res};
use cloakfs_core::format::names::{self, DirId, StoredName};
use cloakfs_core::sync_folder::{self, ConflictCopy, ShownConflict};
use rustix::fd::BorrowedFd;
use rustix::fs::{AtFlags, Dir};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// The entries of one directory shown under conflict names, by backing name.
pub(crate) type Conflicts = BTreeMap<String, ShownConflict>;

impl CloakFs {
    /// The shown name of backing entry `backing` of `dir` (ID `id`, open as `dfd`) if it is
    /// a conflict copy whose original opens; logs each copy once (by its backing name).
    /// `cache` keeps the directory's conflict names for the rest of a listing.
    pub(crate) fn conflict_shown_name(
        &self,
        dir: &Inode,
        id: &DirId,
        dfd: BorrowedFd<'_>,
        backing: &[u8],
        cache: &mut Option<Conflicts>,
    ) -> Option<Vec<u8>> {
        let backing = std::str::from_utf8(backing).ok()?;
        let (copy, _) = self.open_conflict(id, dfd, backing)?;
        self.note_conflict_copy(dir, dfd, backing, &copy);
        let conflicts = cache.get_or_insert_with(|| self.conflicts_of(id, dfd));
        conflicts.get(backing).map(|c| c.shown.clone())
    }

    /// Logs conflict copy `backing` of `dir` the first time this mount lists it.
    pub(crate) fn note_conflict_copy(
        &self,
        dir: &Inode,
        dfd: BorrowedFd<'_>,
        backing: &str,
        copy: &ConflictCopy,
    ) {
        if self.first_report(dir.nodeid, backing.as_bytes()) {
            tracing::warn!(
                "{}/{backing}: a conflict copy made by {}; listed under a name with \"(conflict ...)\"",
                sys::describe(dfd),
                copy.client.label()
            );
        }
    }

    /// The stored form under which plaintext `name` of `dir` is found, as every reader
    /// finds it (`cloakfs_core::sync_folder::locate`): under the directory's ID, else under
    /// the first ID-file copy's ID it exists under (costs nothing in a directory known to
    /// have no copies), else the conflict copy listed under `name` (a scan of the directory,
    /// only for a name of the shown shape found nowhere else), else its stored form under
    /// the directory's ID.
    pub(crate) fn locate(&self, dir: &Inode, name: &OsStr) -> Res<StoredName> {
        let id = self.dir_id(dir)?;
        let others = dir.dir_id.others().unwrap_or_default();
        let exists = |b: &str| rustix::fs::statat(dir.fd(), b, AtFlags::SYMLINK_NOFOLLOW).is_ok();
        sync_folder::locate(
            self.volume.names(),
            &id,
            &others,
            name.as_bytes(),
            exists,
            || self.conflicts_of(&id, dir.fd()),
        )
        .map(|l| l.stored)
        .map_err(|e| fuser::Errno::from_i32(e.errno()))
    }

    /// The entries of directory `dfd` (ID `id`) shown under conflict names, by one scan of
    /// it (`cloakfs_core::sync_folder::conflicts_in_dir`: every reader names them alike).
    pub(crate) fn conflicts_of(&self, id: &DirId, dfd: BorrowedFd<'_>) -> Conflicts {
        let Ok(rfd) = sys::open_dir(dfd) else {
            return Conflicts::new();
        };
        let Ok(mut d) = Dir::read_from(&rfd) else {
            return Conflicts::new();
        };
        let (mut listing, mut copies) = (Vec::new(), Vec::new());
        while let Some(Ok(ent)) = d.read() {
            let raw = ent.file_name().to_bytes();
            if sync_folder::is_dir_id_copy(raw) {
                copies.push(raw.to_vec());
            }
            if let Ok(n) = std::str::from_utf8(raw) {
                if n != "." && n != ".." {
                    listing.push(n.to_string());
                }
            }
        }
        let others = Self::read_dir_id_copies(dfd, &copies, Some(id));
        sync_folder::conflicts_in_dir(self.volume.names(), id, &others, &listing, |long| {
            long_name_of(dfd, long)
        })
    }

    /// The accepted reading of `backing` as a conflict copy, with its original's plaintext.
    fn open_conflict(
        &self,
        id: &DirId,
        dfd: BorrowedFd<'_>,
        backing: &str,
    ) -> Option<(ConflictCopy, Vec<u8>)> {
        sync_folder::open_conflict_copy(self.volume.names(), id, backing, |long| {
            long_name_of(dfd, long)
        })
    }

    /// After backing entry `gone` of `dfd` was removed or renamed away: where it was a
    /// conflict copy of a long-name entry, the copies of that entry's sidecar it leaves
    /// behind go too (`sync_folder::sidecar_copies_left_by`).
    pub(crate) fn remove_conflict_sidecars(&self, dfd: BorrowedFd<'_>, gone: &str) {
        if !sync_folder::conflict_readings(gone)
            .iter()
            .any(|c| c.original.starts_with(names::LONG_PREFIX))
        {
            return;
        }
        let Ok(rfd) = sys::open_dir(dfd) else {
            return;
        };
        let Ok(mut d) = Dir::read_from(&rfd) else {
            return;
        };
        let mut listing = Vec::new();
        while let Some(Ok(ent)) = d.read() {
            if let Ok(n) = std::str::from_utf8(ent.file_name().to_bytes()) {
                listing.push(n.to_string());
            }
        }
        for side in sync_folder::sidecar_copies_left_by(gone, &listing) {
            if let Err(e) = rustix::fs::unlinkat(dfd, side.as_str(), AtFlags::empty()) {
                if e != rustix::io::Errno::NOENT {
                    tracing::warn!(
                        "{}/{side}: cannot remove a conflict copy's sidecar: {e}",
                        sys::describe(dfd)
                    );
                }
            }
        }
    }
}

/// The full encrypted name of long entry `long` of `dfd`: from its sidecar, or, where the
/// sync client left only a conflict copy of the sidecar, from that copy (a sidecar's content
/// is fixed by its name's hash, so any copy of it holds the same name).
fn long_name_of(dfd: BorrowedFd<'_>, long: &str) -> Option<String> {
    let read = |side: &str| {
        let bytes = sys::read_small(dfd, side, names::SIDECAR_MAX).ok()?;
        let full = String::from_utf8(bytes).ok()?.trim_end().to_string();
        (names::long_backing_name(&full) == long).then_some(full)
    };
    let side = names::sidecar_name(long);
    if let Some(full) = read(&side) {
        return Some(full);
    }
    let rfd = sys::open_dir(dfd).ok()?;
    let mut d = Dir::read_from(&rfd).ok()?;
    while let Some(Ok(ent)) = d.read() {
        let Ok(n) = std::str::from_utf8(ent.file_name().to_bytes()) else {
            continue;
        };
        if n != side
            && n.starts_with(long)
            && sync_folder::conflict_readings(n)
                .iter()
                .any(|c| c.original == side)
        {
            if let Some(full) = read(n) {
                return Some(full);
            }
        }
    }
    None
}
