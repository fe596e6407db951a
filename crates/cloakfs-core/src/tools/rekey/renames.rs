//! Pass 2: every entry renamed from its old to its new encrypted name, directory by directory;
//! directory IDs stay, only the key changes.

use super::engine::{rename_noreplace, sorted_names, sync_dir, tampered_at, Engine};
use crate::error::Result;
use crate::format::names::{self, DirId, StoredName};
use crate::tools::walk::{internal_kind, is_payload, long_names, read_dir_id, InternalKind};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

impl Engine<'_> {
    /// Pass 2: every name, directory by directory. Directory IDs stay; only the key changes.
    pub(super) fn names(&mut self) -> Result<()> {
        let mut stack: Vec<PathBuf> = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let dir_id = if dir == self.root {
                self.to.root_dir_id()
            } else {
                read_dir_id(&dir).map_err(|(_, m)| tampered_at(&dir, m))?
            };
            let names = sorted_names(&dir)?;
            for name in names.iter().filter(|n| is_payload(n)) {
                self.check_cancel()?;
                let new = self.name(&dir, &dir_id, name)?;
                let path = dir.join(&new);
                if std::fs::symlink_metadata(&path)?.is_dir() {
                    stack.push(path);
                }
                self.progress.advance(0, 1);
            }
            self.orphan_sidecars(&dir, &dir_id)?;
        }
        Ok(())
    }

    /// Converts the name of entry `name` in `dir`; returns its (possibly new) backing name.
    pub(super) fn name(&mut self, dir: &Path, dir_id: &DirId, name: &OsStr) -> Result<OsString> {
        let at = dir.join(name);
        let s = name
            .to_str()
            .ok_or_else(|| tampered_at(&at, "not an encrypted name"))?;
        match names::classify(s) {
            names::EntryKind::Encrypted(e) => {
                if self.to.names().decrypt_short(dir_id, e).is_ok() {
                    self.summary.already += 1;
                    return Ok(name.to_os_string());
                }
                let plain = match self.from.names().decrypt_short(dir_id, e) {
                    Ok(p) => p,
                    Err(e) => return self.damaged(&at, e).map(|()| name.to_os_string()),
                };
                let stored = self.to.names().encrypt(dir_id, &plain)?;
                let StoredName::Short(new) = stored else {
                    return Err(tampered_at(&at, "name changed its stored form"));
                };
                rename_noreplace(&at, &dir.join(&new))?;
                self.step();
                self.summary.names += 1;
                Ok(new.into())
            }
            names::EntryKind::Long(b) => {
                let sidecar = dir.join(names::sidecar_name(b));
                let full = crate::tools::paths::read_sidecar(&sidecar)
                    .map_err(|e| tampered_at(&at, format!("sidecar: {e}")))?;
                let full = full.trim_end();
                if self.to.names().decrypt_long(dir_id, b, full).is_ok() {
                    self.summary.already += 1;
                    return Ok(name.to_os_string());
                }
                let plain = match self.from.names().decrypt_long(dir_id, b, full) {
                    Ok(p) => p,
                    Err(e) => return self.damaged(&at, e).map(|()| name.to_os_string()),
                };
                let stored = self.to.names().encrypt(dir_id, &plain)?;
                let StoredName::Long { backing, .. } = &stored else {
                    return Err(tampered_at(&at, "name changed its stored form"));
                };
                let new_sidecar = dir.join(names::sidecar_name(backing));
                // A crash may have left it (read-only) from an earlier try.
                match std::fs::remove_file(&new_sidecar) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                }
                crate::tools::paths::write_sidecar(dir, &stored)?;
                if let Ok(m) = std::fs::metadata(&sidecar) {
                    // Same mode as the old sidecar (the mount makes them read-only).
                    std::fs::set_permissions(&new_sidecar, m.permissions())?;
                }
                self.step();
                rename_noreplace(&at, &dir.join(backing))?;
                self.step();
                sync_dir(dir)?;
                std::fs::remove_file(&sidecar)?;
                self.step();
                self.summary.names += 1;
                Ok(backing.into())
            }
            names::EntryKind::Internal => Ok(name.to_os_string()),
        }
    }

    /// Removes sidecars left without their entry by an interrupted long-name conversion (only
    /// those holding a name of this directory under either key).
    pub(super) fn orphan_sidecars(&mut self, dir: &Path, dir_id: &DirId) -> Result<()> {
        let names = sorted_names(dir)?;
        let longs = long_names(&names);
        for n in &names {
            if internal_kind(n, false, &longs) != Some(InternalKind::OrphanSidecar) {
                continue;
            }
            let p = dir.join(n);
            let entry = crate::tools::walk::sidecar_entry(n.to_str().expect("classified as UTF-8"))
                .expect("a sidecar");
            let full = crate::tools::paths::read_sidecar(&p).unwrap_or_default();
            let ours = [self.to, self.from].iter().any(|v| {
                v.names()
                    .decrypt_long(dir_id, entry, full.trim_end())
                    .is_ok()
            });
            if ours {
                std::fs::remove_file(&p)?;
                self.step();
            }
        }
        Ok(())
    }
}
