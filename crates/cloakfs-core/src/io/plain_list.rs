//! The manifest of an adopted tree's plaintext entries (docs/FORMAT.md section 21.1): which
//! backing entries the user's tree held when it was adopted. Only those are served as
//! plaintext; an entry the storage puts there later, under any name, is not, and neither is
//! a listed entry once it was encrypted or removed (it is retired).
//!
//! Each entry is known by a tag, HMAC-SHA256(K, "cloakfs adopted entry\n" || directory ID ||
//! name) cut to 16 bytes, with K = HKDF(master key, "adopted manifest"): it names no
//! plaintext, and without the key no tag can be made. The manifest, `cloakfs.adopted` in the
//! cipher directory, is written once at `init --adopt` (or `upgrade`) and never changes:
//! "cloakfs adopted v1\n", the tags in ascending order, and HMAC-SHA256(K, "cloakfs adopted
//! manifest\n" || everything before it). Retired tags are a grow-only set of records
//! ([`RetiredIds::open_set`]), in the volume and on this machine, so that putting back a
//! removed record does not bring an entry back here.

use crate::crypto::prf::Prf;
use crate::crypto::secret::SecretBytes;
use crate::error::{Error, Result};
use crate::format::names::DirId;
use crate::io::retired::RetiredIds;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The manifest, in the cipher directory's root.
pub const MANIFEST_FILE: &str = "cloakfs.adopted";
/// The records of retired entries, a directory in the cipher directory's root.
pub const RETIRED_DIR: &str = "cloakfs.adopted.retired";
/// The manifest while it is written.
const MANIFEST_TMP: &str = "cloakfs.adopted.tmp";
const MAGIC: &[u8] = b"cloakfs adopted v1\n";
const TAG_DOMAIN: &[u8] = b"cloakfs adopted entry\n";
const MANIFEST_DOMAIN: &[u8] = b"cloakfs adopted manifest\n";
const RETIRED_DOMAIN: &[u8] = b"cloakfs adopted retired entry\n";
const TAG_LEN: usize = 16;
const MAC_LEN: usize = 32;

/// An entry's tag: which directory, which name, under the volume's manifest key.
pub type Tag = [u8; TAG_LEN];

/// K, the manifest key (HKDF(master key, "adopted manifest")), in locked memory.
pub struct ManifestKey {
    key: SecretBytes<32>,
    prf: Prf,
}

impl Clone for ManifestKey {
    fn clone(&self) -> Self {
        Self::new(self.key.clone())
    }
}

impl ManifestKey {
    /// The key `key`, derived by the caller from the master key.
    pub fn new(key: SecretBytes<32>) -> Self {
        Self {
            prf: Prf::new(&key),
            key,
        }
    }

    /// The tag of entry `name` of the directory with ID `dir`.
    pub fn tag(&self, dir: &DirId, name: &[u8]) -> Tag {
        self.prf.out(&[TAG_DOMAIN, &dir.0, name])
    }

    fn seal(&self, body: &[u8]) -> [u8; MAC_LEN] {
        self.prf.out(&[MANIFEST_DOMAIN, body])
    }
}

/// Writes the manifest of `tags` into `cipherdir`, durably, replacing any.
pub fn write_manifest(cipherdir: &Path, key: &ManifestKey, tags: &BTreeSet<Tag>) -> Result<()> {
    let mut body = MAGIC.to_vec();
    for t in tags {
        body.extend_from_slice(t);
    }
    let mac = key.seal(&body);
    body.extend_from_slice(&mac);
    let tmp = cipherdir.join(MANIFEST_TMP);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&body)?;
    f.sync_all()?;
    std::fs::rename(&tmp, cipherdir.join(MANIFEST_FILE))?;
    std::fs::File::open(cipherdir)?.sync_all()?;
    Ok(())
}

/// Reads and authenticates the manifest in `cipherdir`.
fn read_manifest(
    cipherdir: &Path,
    key: &ManifestKey,
) -> std::result::Result<BTreeSet<Tag>, String> {
    let bytes = std::fs::read(cipherdir.join(MANIFEST_FILE))
        .map_err(|e| format!("{MANIFEST_FILE} cannot be read: {e}"))?;
    let body_len = bytes
        .len()
        .checked_sub(MAC_LEN)
        .filter(|n| *n >= MAGIC.len());
    let Some(body_len) = body_len.filter(|n| (n - MAGIC.len()) % TAG_LEN == 0) else {
        return Err(format!(
            "{MANIFEST_FILE} is not a manifest ({} bytes)",
            bytes.len()
        ));
    };
    let (body, mac) = bytes.split_at(body_len);
    if !bytes.starts_with(MAGIC) {
        return Err(format!("{MANIFEST_FILE} is not a manifest of version 1"));
    }
    if !bool::from(subtle::ConstantTimeEq::ct_eq(mac, &key.seal(body)[..])) {
        return Err(format!(
            "{MANIFEST_FILE} does not authenticate (changed, or from another volume)"
        ));
    }
    Ok(body[MAGIC.len()..]
        .chunks_exact(TAG_LEN)
        .map(|c| c.try_into().expect("16 bytes"))
        .collect())
}

/// The tags of the plaintext entries of the tree in `cipherdir`, whose root has ID `root`;
/// `is_plain(dir, name)` tells a plaintext entry from an encrypted one (names cloakfs
/// reserves are neither). A plaintext directory without an ID file is given a random one
/// first, durably, since its entries' tags are bound to it; an encrypted one without is left
/// out (fsck reports it).
pub fn tags_of_tree(
    cipherdir: &Path,
    key: &ManifestKey,
    root: DirId,
    is_plain: &dyn Fn(&DirId, &[u8]) -> bool,
) -> Result<BTreeSet<Tag>> {
    use std::os::unix::ffi::OsStrExt;
    let mut tags = BTreeSet::new();
    let mut pending = vec![(cipherdir.to_path_buf(), root)];
    while let Some((dir, id)) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.as_bytes();
            if !crate::format::names::is_adoptable(name) {
                continue;
            }
            let plain = is_plain(&id, name);
            if plain {
                tags.insert(key.tag(&id, name));
            }
            if entry.file_type()?.is_dir() {
                if let Some(sub) = dir_id_of(&entry.path(), plain)? {
                    pending.push((entry.path(), sub));
                }
            }
        }
    }
    Ok(tags)
}

/// The ID of directory `dir`; a plaintext one (`give`) without an ID file gets one.
fn dir_id_of(dir: &Path, give: bool) -> Result<Option<DirId>> {
    use crate::format::names::DIRID_FILE;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(DIRID_FILE);
    match std::fs::read(&path) {
        Ok(b) => Ok(b.as_slice().try_into().ok().map(DirId)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && give => {
            let id = DirId::random();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o440)
                .open(&path)?;
            f.write_all(&id.0)?;
            f.sync_all()?;
            std::fs::File::open(dir)?.sync_all()?;
            Ok(Some(id))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether `name` (in the cipher directory's root) is one of the manifest's files.
pub fn is_manifest_file(name: &str) -> bool {
    name == MANIFEST_FILE || name == MANIFEST_TMP || name == RETIRED_DIR
}

/// The plaintext entries an adopted tree may serve: its manifest less the retired entries.
pub struct PlainList {
    key: ManifestKey,
    listed: std::result::Result<BTreeSet<Tag>, String>,
    retired: RetiredIds,
}

impl std::fmt::Debug for PlainList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.listed {
            Ok(l) => write!(f, "PlainList({} entries)", l.len()),
            Err(e) => write!(f, "PlainList(unusable: {e})"),
        }
    }
}

impl PlainList {
    /// The list of the tree in `cipherdir` under `key`, with this machine's record of retired
    /// entries at `local` (`None`: none kept). A manifest that is missing or does not
    /// authenticate lists nothing ([`Self::problem`] says why).
    pub fn load(cipherdir: &Path, key: ManifestKey, local: Option<PathBuf>) -> Self {
        let listed = read_manifest(cipherdir, &key);
        let retired = RetiredIds::open_set(
            cipherdir,
            RETIRED_DIR,
            RETIRED_DOMAIN,
            key.key.clone(),
            local,
        );
        Self {
            key,
            listed,
            retired,
        }
    }

    /// Whether plaintext entry `name` of the directory with ID `dir` is served.
    pub fn is_listed(&self, dir: &DirId, name: &[u8]) -> bool {
        let Ok(listed) = &self.listed else {
            return false;
        };
        let tag = self.key.tag(dir, name);
        listed.contains(&tag) && !self.retired.contains(&tag)
    }

    /// Retires entry `name` of `dir` (it was encrypted or removed): no plaintext entry of
    /// that name is served there again. Nothing for an entry the manifest does not list.
    pub fn retire(&self, dir: &DirId, name: &[u8]) -> Result<()> {
        let tag = self.key.tag(dir, name);
        match &self.listed {
            Ok(listed) if listed.contains(&tag) => self.retired.insert(&tag),
            _ => Ok(()),
        }
    }

    /// Why nothing is listed: the manifest is missing or does not authenticate.
    pub fn problem(&self) -> Option<&str> {
        self.listed.as_ref().err().map(String::as_str)
    }

    /// How many entries the manifest lists (retired ones included).
    pub fn len(&self) -> usize {
        self.listed.as_ref().map_or(0, BTreeSet::len)
    }

    /// Whether the manifest lists no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The error of a tool that needs the list but finds it unusable.
pub fn unusable(problem: &str) -> Error {
    Error::Refused(format!(
        "the adopted tree's manifest of plaintext entries: {problem}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ManifestKey {
        ManifestKey::new(SecretBytes::random())
    }

    fn tags(k: &ManifestKey, names: &[&str]) -> BTreeSet<Tag> {
        names
            .iter()
            .map(|n| k.tag(&DirId([7; 16]), n.as_bytes()))
            .collect()
    }

    #[test]
    fn only_listed_entries_of_their_own_directory_are_served() {
        let d = tempfile::tempdir().unwrap();
        let k = key();
        write_manifest(d.path(), &k, &tags(&k, &["a.txt", "b"])).unwrap();
        let l = PlainList::load(d.path(), k, None);
        assert_eq!(l.problem(), None);
        assert_eq!(l.len(), 2);
        assert!(l.is_listed(&DirId([7; 16]), b"a.txt"));
        assert!(!l.is_listed(&DirId([7; 16]), b"c"));
        assert!(!l.is_listed(&DirId([8; 16]), b"a.txt"));
    }

    #[test]
    fn a_retired_entry_stays_retired_after_its_record_is_deleted() {
        let d = tempfile::tempdir().unwrap();
        let local = d.path().join("local");
        let k = key();
        write_manifest(d.path(), &k, &tags(&k, &["a.txt"])).unwrap();
        let l = PlainList::load(d.path(), k.clone(), Some(local.clone()));
        l.retire(&DirId([7; 16]), b"a.txt").unwrap();
        assert!(!l.is_listed(&DirId([7; 16]), b"a.txt"));
        // Another mount of the same volume sees the record.
        let other = PlainList::load(d.path(), k.clone(), None);
        assert!(!other.is_listed(&DirId([7; 16]), b"a.txt"));
        // The storage deletes the records: this machine still knows.
        std::fs::remove_dir_all(d.path().join(RETIRED_DIR)).unwrap();
        let again = PlainList::load(d.path(), k, Some(local));
        assert!(!again.is_listed(&DirId([7; 16]), b"a.txt"));
    }

    #[test]
    fn a_changed_or_foreign_manifest_lists_nothing() {
        let d = tempfile::tempdir().unwrap();
        let k = key();
        write_manifest(d.path(), &k, &tags(&k, &["a.txt"])).unwrap();
        let path = d.path().join(MANIFEST_FILE);
        let good = std::fs::read(&path).unwrap();
        // A tag added by someone without the key.
        let mut forged = good.clone();
        forged.splice(MAGIC.len()..MAGIC.len(), [1u8; 16]);
        std::fs::write(&path, &forged).unwrap();
        let l = PlainList::load(d.path(), k.clone(), None);
        assert!(l.problem().unwrap().contains("does not authenticate"));
        assert!(!l.is_listed(&DirId([7; 16]), b"a.txt"));
        // Another volume's key.
        std::fs::write(&path, &good).unwrap();
        assert!(PlainList::load(d.path(), key(), None).problem().is_some());
        // Cut short, or missing.
        std::fs::write(&path, &good[..20]).unwrap();
        assert!(PlainList::load(d.path(), k.clone(), None)
            .problem()
            .is_some());
        std::fs::remove_file(&path).unwrap();
        assert!(PlainList::load(d.path(), k, None).problem().is_some());
    }

    #[test]
    fn retiring_an_unlisted_entry_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let k = key();
        write_manifest(d.path(), &k, &BTreeSet::new()).unwrap();
        let l = PlainList::load(d.path(), k, None);
        l.retire(&DirId([7; 16]), b"planted").unwrap();
        assert!(!d.path().join(RETIRED_DIR).exists());
    }
}
