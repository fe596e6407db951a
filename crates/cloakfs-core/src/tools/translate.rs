//! Translating paths between the plaintext view and the cipher directory without a mount (CFS
//! `cname`), in both directions, long names included.

use crate::error::{Error, Result};
use crate::format::config::CONFIG_FILE;
use crate::format::names::{self, DIRID_FILE};
use crate::tools::paths::{read_dir_id, read_sidecar};
use crate::volume::Volume;
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Most symlinks followed in one lookup (as Linux's MAXSYMLINKS).
pub const MAX_SYMLINK_HOPS: usize = 40;

fn not_found(what: String) -> Error {
    Error::Io(io::Error::new(io::ErrorKind::NotFound, what))
}

/// The backing path of plaintext path `plain` (relative to the volume root; a leading `/` is
/// allowed). `..` and symlinks inside the volume are resolved (a symlink's target is
/// decrypted); the last component is followed only if `follow_last`. The last component need
/// not exist; every directory before it must. A symlink pointing outside the volume (an
/// absolute target, or `..` above the root) is refused.
pub fn lookup(
    volume: &Volume,
    cipherdir: &Path,
    plain: &Path,
    follow_last: bool,
) -> Result<PathBuf> {
    let mut todo: VecDeque<OsString> = VecDeque::new();
    for c in plain.components() {
        match c {
            Component::Normal(n) => todo.push_back(n.to_os_string()),
            Component::ParentDir => todo.push_back("..".into()),
            Component::RootDir | Component::CurDir => {}
            Component::Prefix(_) => return Err(Error::InvalidName),
        }
    }
    // Backing directories from the root down to the current one, with their plaintext paths.
    let mut stack: Vec<(PathBuf, PathBuf)> = vec![(cipherdir.to_path_buf(), PathBuf::new())];
    let mut hops = 0;
    while let Some(name) = todo.pop_front() {
        let last = todo.is_empty();
        if name == ".." {
            if stack.len() == 1 {
                return Err(Error::Refused(
                    "the path leads above the root of the volume".into(),
                ));
            }
            stack.pop();
            if last {
                return Ok(stack.last().expect("root stays").0.clone());
            }
            continue;
        }
        let (dir, dir_plain) = stack.last().expect("root stays").clone();
        let dir_id = read_dir_id(volume, cipherdir, &dir)?;
        let stored = locate_in(volume, &dir, &dir_id, stack.len() == 1, name.as_bytes())?;
        let backing = dir.join(stored.backing());
        let child_plain = dir_plain.join(&name);
        let meta = match std::fs::symlink_metadata(&backing) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound && last => return Ok(backing),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(not_found(format!(
                    "{}: no such directory in the volume",
                    crate::tools::walk::display_plain(&child_plain)
                )))
            }
            Err(e) => return Err(e.into()),
        };
        if meta.file_type().is_symlink() && (!last || follow_last) {
            hops += 1;
            if hops > MAX_SYMLINK_HOPS {
                return Err(Error::Io(io::Error::from_raw_os_error(libc::ELOOP)));
            }
            let stored = std::fs::read_link(&backing)?;
            let target = crate::io::long_targets::read_target_at(
                volume.meta(),
                cipherdir,
                stored.as_os_str().as_bytes(),
            )?;
            let target = Path::new(OsStr::from_bytes(&target));
            if target.is_absolute() {
                return Err(Error::Refused(format!(
                    "{} is a symlink to {}, outside the volume",
                    crate::tools::walk::display_plain(&child_plain),
                    target.display()
                )));
            }
            let mut spliced: VecDeque<OsString> = target
                .components()
                .filter_map(|c| match c {
                    Component::Normal(n) => Some(n.to_os_string()),
                    Component::ParentDir => Some("..".into()),
                    _ => None,
                })
                .collect();
            spliced.extend(todo.drain(..));
            todo = spliced;
            if todo.is_empty() {
                return Ok(dir);
            }
            continue;
        }
        if last {
            return Ok(backing);
        }
        if !meta.is_dir() {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!(
                    "{} is not a directory",
                    crate::tools::walk::display_plain(&child_plain)
                ),
            )));
        }
        stack.push((backing, child_plain));
    }
    Ok(stack.last().expect("root stays").0.clone())
}

/// The stored form of plaintext `name` in backing directory `dir` (ID `dir_id`) under which
/// the mount finds it (`sync_folder::locate`): under the directory's ID, else, in a directory
/// with copies of its ID file, under a copy's ID or as an entry listed under a conflict name.
/// The directory is listed only when the name is not under its ID.
fn locate_in(
    volume: &Volume,
    dir: &Path,
    dir_id: &names::DirId,
    is_root: bool,
    name: &[u8],
) -> Result<names::StoredName> {
    let stored = volume.names().encrypt(dir_id, name)?;
    if dir.join(stored.backing()).symlink_metadata().is_ok() {
        return Ok(stored);
    }
    let listing: Vec<OsString> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?,
        Err(_) => return Ok(stored),
    };
    // The root has no `cloakfs.dirid`, so no copies of one (as the walk reads it).
    let others = if is_root {
        Vec::new()
    } else {
        crate::tools::dir_id_merge::named_copies(dir, &listing, dir_id)
    };
    let ids: Vec<names::DirId> = others.iter().map(|(_, id)| *id).collect();
    let conflicts = || {
        let strings: Vec<String> = listing
            .iter()
            .filter_map(|n| n.to_str().map(str::to_string))
            .collect();
        crate::sync_folder::conflicts_in_dir(volume.names(), dir_id, &others, &strings, |long| {
            crate::sync_folder::long_name_in(dir, long)
        })
    };
    let exists = |b: &str| dir.join(b).symlink_metadata().is_ok();
    Ok(crate::sync_folder::locate(volume.names(), dir_id, &ids, name, exists, conflicts)?.stored)
}

/// `backing` as a path relative to `cipherdir` (both made absolute, without resolving the last
/// component of `backing`, which may be a symlink). A relative `backing` that does not exist
/// from the current directory is taken relative to `cipherdir`.
pub fn relative_backing(cipherdir: &Path, backing: &Path) -> Result<PathBuf> {
    let root = std::fs::canonicalize(cipherdir)?;
    let candidates = if backing.is_absolute() {
        vec![backing.to_path_buf()]
    } else {
        vec![backing.to_path_buf(), root.join(backing)]
    };
    for c in candidates {
        let abs = match (c.parent(), c.file_name()) {
            (Some(p), Some(n)) => {
                let p = if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                };
                match std::fs::canonicalize(p) {
                    Ok(p) => p.join(n),
                    Err(_) => continue,
                }
            }
            _ => match std::fs::canonicalize(&c) {
                Ok(p) => p,
                Err(_) => continue,
            },
        };
        if let Ok(rel) = abs.strip_prefix(&root) {
            return Ok(rel.to_path_buf());
        }
    }
    Err(Error::Refused(format!(
        "{} is not inside the cipher directory {}",
        backing.display(),
        cipherdir.display()
    )))
}

/// The plaintext path (relative to the volume root) of backing path `backing`, which is
/// absolute, relative to the current directory, or relative to `cipherdir`. A long-name
/// sidecar (`cloakfs.long.*.name`) as the last component decrypts to the name it holds, so
/// orphaned sidecars can be identified too. Only the directories need to exist (and the
/// sidecar of a long name).
pub fn decrypt_path(volume: &Volume, cipherdir: &Path, backing: &Path) -> Result<PathBuf> {
    decrypt_path_noting(volume, cipherdir, backing).map(|(p, _)| p)
}

/// [`decrypt_path`], with a note for each component that is named under another ID of its
/// directory than its `cloakfs.dirid` (a sync client's copy of that file: two devices gave
/// the directory different IDs; FORMAT.md section 9.2).
pub fn decrypt_path_noting(
    volume: &Volume,
    cipherdir: &Path,
    backing: &Path,
) -> Result<(PathBuf, Vec<String>)> {
    let mut notes = Vec::new();
    let rel = relative_backing(cipherdir, backing)?;
    let root = std::fs::canonicalize(cipherdir)?;
    let mut dir = root.clone();
    let mut plain = PathBuf::new();
    let comps: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    for (i, name) in comps.iter().enumerate() {
        let last = i + 1 == comps.len();
        let dir_id = read_dir_id(volume, &root, &dir).map_err(|e| match e {
            Error::Io(e) if e.kind() == io::ErrorKind::NotFound => not_found(format!(
                "{}: {DIRID_FILE} is missing, the names in it cannot be decrypted",
                dir.display()
            )),
            e => e,
        })?;
        let s = name.to_str().ok_or_else(|| {
            Error::Tampered(format!("{}: not an encrypted name", name.to_string_lossy()))
        })?;
        let open = |id: &names::DirId| match names::classify(s) {
            names::EntryKind::Encrypted(e) => volume.names().decrypt_short(id, e),
            names::EntryKind::Long(b) => {
                let full = read_sidecar(&dir.join(names::sidecar_name(b))).map_err(|e| {
                    Error::Tampered(format!("long name {b}: cannot read its sidecar ({e})"))
                })?;
                volume.names().decrypt_long(id, b, full.trim_end())
            }
            names::EntryKind::Internal => Err(Error::InvalidName),
        };
        let under_main = open(&dir_id);
        // Not named under the directory's ID: a sync client's conflict copy, or named under a
        // copy of the directory's ID file; shown as the mount lists it.
        let elsewhere = match &under_main {
            Ok(_) => None,
            Err(_) => {
                let listing: Vec<OsString> = std::fs::read_dir(&dir)?
                    .map(|e| e.map(|e| e.file_name()))
                    .collect::<io::Result<_>>()?;
                let others = crate::tools::dir_id_merge::named_copies(&dir, &listing, &dir_id);
                let strings: Vec<String> = listing
                    .iter()
                    .filter_map(|n| n.to_str().map(str::to_string))
                    .collect();
                let conflicts = crate::sync_folder::conflicts_in_dir(
                    volume.names(),
                    &dir_id,
                    &others,
                    &strings,
                    |long| crate::sync_folder::long_name_in(&dir, long),
                );
                let copy = others
                    .iter()
                    .find_map(|(copy, id)| open(id).ok().map(|p| (p, copy.clone())));
                match (conflicts.get(s), copy) {
                    (Some(c), copy) => Some((c.shown.clone(), copy.map(|(_, n)| n))),
                    (None, Some((p, n))) => Some((p, Some(n))),
                    (None, None) => None,
                }
            }
        };
        if let Some((shown, Some(copy))) = &elsewhere {
            notes.push(format!(
                "{}: named under the directory ID in {copy} (a sync client's copy of the \
                 directory's {DIRID_FILE}: two devices gave it different IDs), not under \
                 {DIRID_FILE}; `cloakfs fsck --repair` merges them under one",
                crate::tools::walk::display_plain(&plain.join(OsStr::from_bytes(shown))),
            ));
        }
        let plain_name = match (names::classify(s), under_main) {
            (_, Ok(p)) => p,
            _ if elsewhere.is_some() => elsewhere.map(|(p, _)| p).unwrap_or_default(),
            (names::EntryKind::Encrypted(_) | names::EntryKind::Long(_), Err(e)) => return Err(e),
            (names::EntryKind::Internal, Err(_)) => match crate::tools::walk::sidecar_entry(s) {
                Some(entry) if last => {
                    let full = read_sidecar(&dir.join(s))?;
                    volume
                        .names()
                        .decrypt_long(&dir_id, entry, full.trim_end())?
                }
                _ => {
                    return Err(Error::Refused(format!(
                        "{s} is one of cloakfs's own files, not an encrypted name"
                    )))
                }
            },
        };
        plain.push(OsStr::from_bytes(&plain_name));
        dir.push(name);
    }
    Ok((plain, notes))
}

/// The cipher directory holding backing path `start`: the nearest directory at or above it
/// that contains `cloakfs.conf`.
pub fn find_volume_root(start: &Path) -> Option<PathBuf> {
    let abs = std::fs::canonicalize(start).ok()?;
    abs.ancestors()
        .find(|d| d.join(CONFIG_FILE).is_file())
        .map(Path::to_path_buf)
}
