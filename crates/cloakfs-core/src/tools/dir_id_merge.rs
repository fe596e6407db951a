//! Directories holding sync clients' copies of their `cloakfs.dirid` (a conflict between two
//! devices that gave one directory different IDs; `sync_folder::is_dir_id_copy`): the IDs of
//! the copies, used by the walk to name the entries made under them, and the merge
//! `fsck --repair` does: each entry is renamed to its name under one ID, the one derived from
//! the directory's parent and name (FORMAT.md 9.2, so that two devices that repair agree; a
//! name
//! taken under both gets the conflict name every reader lists it under,
//! `sync_folder::conflicts_in_dir`), then the copies nothing is named under
//! any more are removed. Nothing but the now unused copies is ever deleted.

use crate::format::names::{self, DirId, StoredName, DIRID_FILE};
use crate::sync_folder::is_dir_id_copy;
use crate::tools::paths::{parse_dir_id, write_sidecar, DIRID_LEN};
use crate::tools::walk::decrypt_name;
use crate::volume::Volume;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The ID-file copies in `names` of backing directory `dir`, with their IDs, leaving out those
/// that hold `main` or are not 16 bytes.
pub fn copies(dir: &Path, names: &[OsString], main: &DirId) -> Vec<(PathBuf, DirId)> {
    let mut out: Vec<(PathBuf, DirId)> = Vec::new();
    for n in names.iter().filter(|n| is_dir_id_copy(n.as_bytes())) {
        let path = dir.join(n);
        let mut bytes = Vec::new();
        let read = std::fs::File::open(&path)
            .and_then(|f| f.take(DIRID_LEN as u64 + 1).read_to_end(&mut bytes));
        if let (Ok(_), Ok(id)) = (read, parse_dir_id(&bytes)) {
            if id != *main {
                out.push((path, id));
            }
        }
    }
    out
}

/// The ID-file copies of [`copies`] by file name, sorted by it, each ID once: the order in
/// which readers try them (the first that has a name keeps it).
pub fn named_copies(dir: &Path, names: &[OsString], main: &DirId) -> Vec<(String, DirId)> {
    let mut v: Vec<(String, DirId)> = copies(dir, names, main)
        .into_iter()
        .filter_map(|(p, id)| Some((p.file_name()?.to_str()?.to_string(), id)))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    let mut seen: Vec<DirId> = Vec::new();
    v.retain(|(_, id)| {
        let fresh = !seen.contains(id);
        seen.push(*id);
        fresh
    });
    v
}

/// Merges backing directory `dir` (ID `main`) with its ID-file copies under ID `target`
/// (`main`, or the ID derived from the parent's and the directory's name: FORMAT.md 9.2, so
/// that two devices that repair agree): renames every entry to its name under `target` (the
/// name it is listed under: a name taken under two IDs keeps its conflict name, and so does a
/// sync client's conflict copy, which would not open once `main` is gone), makes `target` the
/// directory's ID, then removes the ID-file copies (and the copies of long conflict copies'
/// sidecars, which name nothing any more). Every entry stays readable at every
/// step: `target` is written as one more copy of the ID file before any entry is renamed under
/// it. Returns how many entries it renamed.
pub fn merge(volume: &Volume, dir: &Path, main: &DirId, target: &DirId) -> std::io::Result<usize> {
    let other = |e: crate::error::Error| std::io::Error::other(e.to_string());
    let names = list(dir)?;
    let others = named_copies(dir, &names, main);
    let listing: Vec<String> = names
        .iter()
        .filter_map(|n| n.to_str().map(str::to_string))
        .collect();
    let shown =
        crate::sync_folder::conflicts_in_dir(volume.names(), main, &others, &listing, |l| {
            crate::sync_folder::long_name_in(dir, l)
        });
    // Each entry with the name it is listed under and the ID it is named under now.
    let mut sorted: Vec<&OsString> = names.iter().collect();
    sorted.sort();
    let mut moves = Vec::new();
    for name in sorted
        .into_iter()
        .filter(|n| crate::tools::walk::is_payload(n))
    {
        let found = std::iter::once(main)
            .chain(others.iter().map(|(_, id)| id))
            .find_map(|id| {
                decrypt_name(volume, id, dir, name)
                    .ok()
                    .map(|(p, _)| (p, *id))
            });
        let Some((plain, id)) = found else {
            continue;
        };
        let listed = name
            .to_str()
            .and_then(|n| shown.get(n))
            .map_or_else(|| plain.clone(), |c| c.shown.clone());
        if id != *target || listed != plain {
            moves.push((name.clone(), plain, id, listed, false));
        }
    }
    // A sync client's conflict copy opens only while its original's name does: unless that
    // is under `target`, it is renamed to the name it is listed under, an entry of its own.
    for (backing, c) in &shown {
        let opens_under_target = || {
            crate::sync_folder::open_conflict_copy(volume.names(), target, backing, |l| {
                crate::sync_folder::long_name_in(dir, l)
            })
            .is_some()
        };
        if c.copy.original != DIRID_FILE && !opens_under_target() {
            let name = OsString::from(backing);
            moves.push((name, c.original.clone(), *main, c.shown.clone(), true));
        }
    }
    let copies: Vec<OsString> = moves.iter().filter(|m| m.4).map(|m| m.0.clone()).collect();
    if moves.is_empty() && others.is_empty() && main == target {
        return Ok(0);
    }
    // The target ID as one more copy of the ID file, durable before anything is named under it.
    let staged = dir.join(format!("{STAGED_PREFIX}{}.dirid", hex(&target.0)));
    if target != main {
        let mut f = std::fs::File::create(&staged)?;
        f.write_all(&target.0)?;
        f.sync_all()?;
        if let Ok(m) = std::fs::metadata(dir.join(DIRID_FILE)) {
            std::fs::set_permissions(&staged, m.permissions())?;
        }
        std::fs::File::open(dir)?.sync_all()?;
    }
    // An entry whose new name another entry still holds waits until that one has moved.
    let mut moved = 0;
    while !moves.is_empty() {
        let before = moves.len();
        let mut waiting = Vec::new();
        for (name, plain, id, listed, copy) in moves {
            let stored = volume.names().encrypt(target, &listed).map_err(other)?;
            if dir.join(stored.backing()).symlink_metadata().is_ok() {
                waiting.push((name, plain, id, listed, copy));
                continue;
            }
            write_sidecar(dir, &stored).map_err(other)?;
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                dir.join(&name).as_path(),
                rustix::fs::CWD,
                dir.join(stored.backing()).as_path(),
                rustix::fs::RenameFlags::NOREPLACE,
            )?;
            // The old long name's sidecar, now without its entry (a copy's original keeps its
            // own until it moves).
            if let (StoredName::Long { backing, .. }, false) =
                (volume.names().encrypt(&id, &plain).map_err(other)?, copy)
            {
                if backing != stored.backing() {
                    let _ = std::fs::remove_file(dir.join(names::sidecar_name(&backing)));
                }
            }
            moved += 1;
        }
        if waiting.len() == before {
            return Err(std::io::Error::other(format!(
                "{} entries cannot be renamed under the merged ID: their names are taken",
                waiting.len()
            )));
        }
        moves = waiting;
    }
    // The copies of long copies' sidecars, which name nothing any more.
    let left: Vec<String> = list(dir)?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .collect();
    for gone in copies.iter().filter_map(|n| n.to_str()) {
        for side in crate::sync_folder::sidecar_copies_left_by(gone, &left) {
            match std::fs::remove_file(dir.join(side)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    std::fs::File::open(dir)?.sync_all()?;
    if target != main {
        std::fs::rename(&staged, dir.join(DIRID_FILE))?;
        std::fs::File::open(dir)?.sync_all()?;
    }
    // Nothing is named under any copy any more.
    for n in list(dir)? {
        if is_dir_id_copy(n.as_bytes()) {
            std::fs::remove_file(dir.join(&n))?;
        }
    }
    std::fs::File::open(dir)?.sync_all()?;
    Ok(moved)
}

/// Name prefix of the ID-file copy a merge writes before renaming entries under its ID.
pub const STAGED_PREFIX: &str = "cloakfs.merge.";

fn list(dir: &Path) -> std::io::Result<Vec<OsString>> {
    std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
