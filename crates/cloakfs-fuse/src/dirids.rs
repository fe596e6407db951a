//! Directory IDs remembered beyond the life of their nodes.
//!
//! A node keeps its directory's ID only while the kernel holds the node. After the kernel
//! drops its caches (memory pressure, `drop_caches`), every directory listed again would cost
//! a cold read of its one-block `cloakfs.dirid`: under `ls -lR` of a 13k-file tree that was
//! 1,350 of 2,910 disk reads. A stat of the file is enough to find its ID here, and its inode
//! is read along with those of the entries the listing stats anyway.
//!
//! The key is the file's (device, inode, size, mtime, ctime), so a file rewritten or replaced
//! in the cipher directory (a repair, a sync tool) misses and is read again, and a reused inode
//! number comes with a new ctime. The ID a miss stores is keyed by a stat of the descriptor
//! it was read from, never by an earlier stat of the name.

use crate::sys::FileVersion;
use cloakfs_core::format::names::DirId;
use rustix::fs::Stat;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Most IDs kept (about 80 bytes each).
const MAX_IDS: usize = 32 * 1024;

/// Directory IDs by the identity of the `cloakfs.dirid` file they came from.
#[derive(Debug, Default)]
pub(crate) struct DirIdCache {
    ids: Mutex<HashMap<FileVersion, DirId>>,
    /// Files read because they were not here.
    reads: AtomicU64,
}

impl DirIdCache {
    /// The ID of the file whose stat is `st`; on a miss, `read` opens and reads the file and
    /// returns its ID with the stat of the descriptor it read.
    pub(crate) fn get_or_read<E>(
        &self,
        st: &Stat,
        read: impl FnOnce() -> Result<(Stat, DirId), E>,
    ) -> Result<DirId, E> {
        if let Some(id) = self.get(st) {
            return Ok(id);
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        let (st, id) = read()?;
        self.insert(&st, id);
        Ok(id)
    }

    /// The ID of the file whose stat is `st`, if it is here.
    pub(crate) fn get(&self, st: &Stat) -> Option<DirId> {
        self.lock().get(&FileVersion::of(st)).copied()
    }

    /// Remembers `id` as the content of the file whose stat is `st`.
    pub(crate) fn insert(&self, st: &Stat, id: DirId) {
        self.insert_key(FileVersion::of(st), id);
    }

    fn insert_key(&self, key: FileVersion, id: DirId) {
        let mut ids = self.lock();
        if ids.len() >= MAX_IDS && !ids.contains_key(&key) {
            // Any one will do: a miss costs one small read.
            if let Some(old) = ids.keys().next().copied() {
                ids.remove(&old);
            }
        }
        ids.insert(key, id);
    }

    /// How many files were read because they were not here.
    pub(crate) fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<FileVersion, DirId>> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A directory node's ID: read on first use, and replaced when the directory's ID file is
/// found replaced (a sync client renamed another device's version into place), so the mount
/// follows the folder without a remount.
///
/// It also keeps the IDs of the directory's ID-file copies (a sync conflict's losing side,
/// see `dir_id_copies`): `None` until the directory was scanned for them.
#[derive(Debug, Default)]
pub(crate) struct NodeDirId(Mutex<Option<DirId>>, Mutex<Option<Vec<DirId>>>);

impl NodeDirId {
    pub(crate) fn get(&self) -> Option<DirId> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the ID if none is known yet; returns the one known.
    pub(crate) fn get_or_init(&self, id: DirId) -> DirId {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(id)
    }

    /// The IDs of the directory's ID-file copies, if it was scanned for them.
    pub(crate) fn others(&self) -> Option<Vec<DirId>> {
        self.1.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Remembers the IDs of the directory's ID-file copies found by a scan.
    pub(crate) fn set_others(&self, ids: Vec<DirId>) {
        *self.1.lock().unwrap_or_else(|e| e.into_inner()) = Some(ids);
    }

    /// Replaces the known ID; returns whether it changed (a node whose ID was never read
    /// has nothing to change).
    pub(crate) fn replace(&self, id: DirId) -> bool {
        let mut known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match *known {
            Some(old) if old != id => {
                *known = Some(id);
                // The old ID may now be in a copy: scanned again when needed.
                *self.1.lock().unwrap_or_else(|e| e.into_inner()) = None;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ino: u64) -> FileVersion {
        FileVersion {
            dev: 1,
            ino,
            size: 16,
            mtime: (0, 0),
            ctime: (0, 0),
        }
    }

    #[test]
    fn stays_bounded_and_keeps_the_newest() {
        let c = DirIdCache::default();
        for i in 0..MAX_IDS as u64 + 100 {
            c.insert_key(key(i), DirId([i as u8; 16]));
        }
        let ids = c.lock();
        assert_eq!(ids.len(), MAX_IDS);
        let last = MAX_IDS as u64 + 99;
        assert_eq!(ids.get(&key(last)), Some(&DirId([last as u8; 16])));
    }
}
