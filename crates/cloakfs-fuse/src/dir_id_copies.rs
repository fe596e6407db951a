//! Directories that hold sync clients' copies of their `cloakfs.dirid`: two devices gave one
//! directory different IDs (made by versions before derived IDs), and the client kept one ID
//! file and renamed the other (`sync_folder::is_dir_id_copy`). The entries the losing device
//! named under its ID stay reachable: a name that does not decrypt under the directory's ID is
//! tried under each copy's, and a plaintext name missing under the main ID is looked for under
//! the others. New entries are always named under the main ID; `fsck --repair` merges.
//!
//! A directory's copies are found by the listing (which sees every name anyway) or, on a
//! lookup miss in a directory not listed yet, by one scan; a directory without copies then
//! costs nothing more.

use crate::dir::ListEntry;
use crate::fs::CloakFs;
use crate::inode::Inode;
use crate::sys::{self, errno, Res};
use cloakfs_core::format::names::{Classified, DirId, DIRID_FILE};
use cloakfs_core::sync_folder::is_dir_id_copy;
use cloakfs_core::tools::paths::{parse_dir_id, DIRID_LEN};
use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{AtFlags, RawDir};
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

/// A listed backing entry whose name does not decrypt under the directory's ID, or an
/// internal one (which may be a conflict copy of an entry named under an ID-file copy's ID).
pub(crate) struct Unnamed {
    /// Where in the listing it belongs.
    pub at: usize,
    pub raw: Vec<u8>,
    /// Why it is not named under the main ID (None: an internal name, never reported).
    pub why: Option<&'static str>,
    pub ino: u64,
    pub file_type: rustix::fs::FileType,
    pub next: u64,
}

impl CloakFs {
    /// The IDs in ID-file copies `names` of directory `dir` that differ from `main`, each
    /// once, with the copy's name, in the order of the names (as every reader tries them:
    /// `cloakfs_core::tools::dir_id_merge::named_copies`). Unreadable or malformed copies are
    /// skipped: they name nothing.
    pub(crate) fn read_dir_id_copies(
        dir: BorrowedFd<'_>,
        names: &[Vec<u8>],
        main: Option<&DirId>,
    ) -> Vec<(String, DirId)> {
        let mut names: Vec<&str> = names
            .iter()
            .filter_map(|n| std::str::from_utf8(n).ok())
            .collect();
        names.sort_unstable();
        let mut ids: Vec<(String, DirId)> = Vec::new();
        for n in names {
            let Ok(file) = sys::open_internal(dir, n) else {
                continue;
            };
            let Ok(bytes) = sys::read_fd_small(file, DIRID_LEN) else {
                continue;
            };
            if let Ok(id) = parse_dir_id(&bytes) {
                if Some(&id) != main && !ids.iter().any(|(_, i)| *i == id) {
                    ids.push((n.to_string(), id));
                }
            }
        }
        ids
    }

    /// The IDs of `dir`'s ID-file copies, scanning the directory once if no listing has.
    pub(crate) fn other_dir_ids(&self, dir: &Inode) -> Res<Vec<DirId>> {
        if let Some(ids) = dir.dir_id.others() {
            return Ok(ids);
        }
        let main = self.dir_id(dir)?;
        let rfd = sys::open_dir(dir.fd()).map_err(errno)?;
        let mut buf = Vec::with_capacity(64 << 10);
        let mut d = RawDir::new(&rfd, buf.spare_capacity_mut());
        let mut copies = Vec::new();
        while let Some(ent) = d.next() {
            let ent = ent.map_err(errno)?;
            let raw = ent.file_name().to_bytes();
            if is_dir_id_copy(raw) {
                copies.push(raw.to_vec());
            }
        }
        let copies = Self::read_dir_id_copies(rfd.as_fd(), &copies, Some(&main));
        Ok(self.remember_dir_id_copies(dir, rfd.as_fd(), copies))
    }

    /// Remembers the IDs of `dir`'s ID-file copies `copies` (as read by
    /// [`Self::read_dir_id_copies`]) for lookups, and logs the first time this mount meets the
    /// directory with these copies (not at each listing or lookup).
    fn remember_dir_id_copies(
        &self,
        dir: &Inode,
        dfd: BorrowedFd<'_>,
        copies: Vec<(String, DirId)>,
    ) -> Vec<DirId> {
        let ids: Vec<DirId> = copies.iter().map(|(_, id)| *id).collect();
        dir.dir_id.set_others(ids.clone());
        if copies.is_empty() {
            return ids;
        }
        let names: Vec<&str> = copies.iter().map(|(n, _)| n.as_str()).collect();
        let key = [b"dirid copies:".as_slice(), names.join("/").as_bytes()].concat();
        if self.first_report(dir.nodeid, &key) {
            tracing::warn!(
                "{}: directory has several IDs (a sync client's {} of its {DIRID_FILE}: two \
                 devices gave it different IDs); the entries named under them are listed too, \
                 new ones are named under {DIRID_FILE}; `cloakfs fsck --repair` merges them",
                sys::describe(dfd),
                names.join(", ")
            );
        }
        ids
    }

    /// Decrypts backing name `raw` of directory `dir` under one of `others` (its ID-file
    /// copies' IDs), if it decrypts under one.
    pub(crate) fn decrypt_under_others(
        &self,
        others: &[DirId],
        raw: &[u8],
        sidecar: impl Fn(&str) -> Result<String, &'static str>,
    ) -> Option<Vec<u8>> {
        others.iter().find_map(|id| {
            match self
                .volume
                .names()
                .classify_entry(Some(id), raw, false, &sidecar)
            {
                Classified::Encrypted(p) => Some(p),
                _ => None,
            }
        })
    }

    /// After a lookup miss in `dir`: whether it has ID-file copies not yet known (one scan,
    /// once per directory node), so the lookup is worth repeating.
    pub(crate) fn learn_dir_id_copies(&self, dir: &Inode) -> bool {
        dir.dir_id.others().is_none() && self.other_dir_ids(dir).is_ok_and(|o| !o.is_empty())
    }

    /// Names the entries of a listing of `dir` that did not decrypt under its ID `main` (kept
    /// in `unnamed`) under the IDs of its ID-file copies `copies`, and puts them in their place
    /// in `out`; returns how many it named. A full listing (`from` 0) remembers the copies'
    /// IDs for lookups.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn name_under_copies(
        &self,
        dir: &Inode,
        dfd: BorrowedFd<'_>,
        main: Option<&DirId>,
        from: u64,
        copies: &[Vec<u8>],
        unnamed: &mut Vec<Unnamed>,
        out: &mut Vec<ListEntry>,
        dev: u64,
        conflicts: &mut Option<crate::conflicts::Conflicts>,
    ) -> usize {
        let others = if from == 0 {
            let copies = Self::read_dir_id_copies(dfd, copies, main);
            self.remember_dir_id_copies(dir, dfd, copies)
        } else {
            self.other_dir_ids(dir).unwrap_or_default()
        };
        if others.is_empty() || unnamed.is_empty() {
            return 0;
        }
        let mut named = Vec::new();
        // A name taken under the main ID (or an earlier copy) too is shown under its conflict
        // name, as every reader shows it, until `fsck --repair` renames it to that: never two
        // entries of one name.
        let mut taken: std::collections::HashSet<OsString> =
            out.iter().map(|e| e.name.clone()).collect();
        unnamed.retain(|u| {
            let plain = u.why.and_then(|_| {
                self.decrypt_under_others(&others, &u.raw, |b| Self::read_sidecar(dfd, b))
            });
            let Some(p) = plain else {
                // A conflict copy of an entry named under an ID-file copy's ID.
                let copy = main.and_then(|id| {
                    let conflicts = conflicts.get_or_insert_with(|| self.conflicts_of(id, dfd));
                    conflicts.get(std::str::from_utf8(&u.raw).ok()?).cloned()
                });
                let Some(c) = copy else {
                    return true;
                };
                let backing = String::from_utf8_lossy(&u.raw);
                self.note_conflict_copy(dir, dfd, &backing, &c.copy);
                if taken.insert(OsString::from_vec(c.shown.clone())) {
                    named.push((u.at, c.shown, u.raw.clone(), u.ino, u.file_type, u.next));
                }
                return false;
            };
            let shown = main.and_then(|id| {
                let conflicts = conflicts.get_or_insert_with(|| self.conflicts_of(id, dfd));
                let c = conflicts.get(std::str::from_utf8(&u.raw).ok()?)?;
                Some(c.shown.clone())
            });
            let name = shown.unwrap_or(p);
            if taken.insert(OsString::from_vec(name.clone())) {
                named.push((u.at, name, u.raw.clone(), u.ino, u.file_type, u.next));
            }
            false
        });
        let count = named.len();
        // From the last, so each earlier position still holds.
        for (at, plain, raw, ino, file_type, next) in named.into_iter().rev() {
            let Ok(backing) = String::from_utf8(raw) else {
                continue;
            };
            let kind = match crate::dir::kind_of_dirent(file_type) {
                Some(k) => k,
                None => {
                    match rustix::fs::statat(dfd, backing.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(st) => crate::attr::Meta::from_stat(&st)
                            .kind()
                            .unwrap_or(fuser::FileType::RegularFile),
                        Err(_) => continue,
                    }
                }
            };
            out.insert(
                at,
                ListEntry {
                    name: OsString::from_vec(plain),
                    ino: self.inodes.number_hint(dev, ino),
                    kind,
                    backing: Some(backing),
                    plain: false,
                    next,
                },
            );
        }
        count
    }
}
