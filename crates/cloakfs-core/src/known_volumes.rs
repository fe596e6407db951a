//! Key pinning: every machine remembers, per user, each volume it has opened (its volume ID,
//! the fingerprint of its master key, and the cipher directories it was opened from), and
//! refuses a volume that now opens to another master key.
//!
//! Why: a slot that anyone can make from public information (an age, ssh or gpg recipient)
//! lets whoever can write the cipher directory replace the whole config with one of their own
//! that the victim's identity opens, to a master key the attacker knows. The config MAC cannot
//! see that, since it is checked under the key the config itself yields. The first unlock on a
//! machine is trusted (like ssh's known_hosts); from then on a replaced config is refused.
//!
//! A directory is remembered both as the user named it (absolute, symlinks kept) and as it
//! resolved (canonical), and a directory remembered for one volume that now holds another,
//! known or not, is refused: a symlink planted where the volume was, or another volume's
//! config copied over it, does not pass as a first use or as the other volume.
//! A first use whose root holds entries that are not the volume's (renamed away so the
//! listing skips them) is judged by the caller's vetting ([`vet_first_use`]) before it is
//! remembered.
//!
//! The record is JSON (`known_volumes.json`) in the user's state directory: the directory
//! named by `CLOAKFS_STATE_DIR` if set; for root `/var/lib/cloakfs`; otherwise
//! `$XDG_STATE_HOME/cloakfs` or `~/.local/state/cloakfs`. It holds no secret. Changes are made
//! under an exclusive lock (`known_volumes.lock`) and written atomically.

use crate::crypto::keys::KeyFingerprint;
use crate::error::{Error, Result};
use crate::format::names::{self, Classified, RESERVED_PREFIX};
use crate::text::{b64, unb64_array};
use crate::volume::Volume;
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Environment variable naming the state directory (overrides the defaults).
pub const STATE_DIR_ENV: &str = "CLOAKFS_STATE_DIR";
/// File name of the record inside the state directory.
pub const RECORD_FILE: &str = "known_volumes.json";
const LOCK_FILE: &str = "known_volumes.lock";
const RECORD_VERSION: u64 = 1;
/// A record larger than this is refused rather than read (it holds one short entry per volume).
const RECORD_MAX_BYTES: u64 = 16 << 20;

/// What this machine remembers of one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownVolume {
    /// The volume ID.
    pub volume_id: [u8; 16],
    /// The fingerprint of the master key it opened to.
    pub fingerprint: KeyFingerprint,
    /// The fingerprint of the key a rekey started on this machine moves it to, until the
    /// rekey completes or is rolled back; both open it meanwhile.
    pub pending: Option<KeyFingerprint>,
    /// Cipher directories it was opened from: each both as named and as resolved ([`Place`]).
    pub cipherdirs: Vec<PathBuf>,
    /// When this machine first opened it (seconds since the Unix epoch).
    pub first_seen: u64,
}

/// How a successful [`KnownVolumes::check`] went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinned {
    /// The volume was known and opened to the remembered key.
    Known,
    /// First use on this machine: the volume is remembered from now on.
    FirstUse,
    /// First use, but the record could not be saved (the message says why): the volume is
    /// not protected by pinning on this machine until it can be.
    NotRemembered(String),
}

/// Where a volume was opened from: the cipher directory as the user named it (absolute, its
/// symlinks not resolved) and where that led (canonical). Both are remembered and checked,
/// so a name that led to one volume and now leads to another is seen whichever changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The path as named, made absolute.
    pub named: PathBuf,
    /// The path with every symlink resolved.
    pub canonical: PathBuf,
}

impl Place {
    /// `path` as named, resolved now (as named if it cannot be resolved).
    pub fn of(path: &Path) -> Self {
        let canonical = fs::canonicalize(path).unwrap_or_else(|_| absolute(path));
        Self::resolved(path, canonical)
    }

    /// `path` as named, already resolved to `canonical` by the caller (who opens that).
    pub fn resolved(path: &Path, canonical: PathBuf) -> Self {
        Self {
            named: absolute(path),
            canonical,
        }
    }

    /// The named path, then the canonical one if it differs.
    fn paths(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.named.as_path())
            .chain(Some(self.canonical.as_path()).filter(|c| *c != self.named))
    }

    /// The known volumes of `all` that were opened from this place (by either path).
    pub fn remembered_in<'a>(
        &'a self,
        all: &'a [KnownVolume],
    ) -> impl Iterator<Item = &'a KnownVolume> {
        all.iter()
            .filter(|v| self.paths().any(|p| v.cipherdirs.iter().any(|d| d == p)))
    }

    /// The known volume other than `volume_id` that was opened from this place, if any.
    pub fn held_by_other<'a>(
        &'a self,
        all: &'a [KnownVolume],
        volume_id: &[u8; 16],
    ) -> Option<&'a KnownVolume> {
        self.remembered_in(all).find(|v| &v.volume_id != volume_id)
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.named == self.canonical {
            write!(f, "{}", self.named.display())
        } else {
            write!(
                f,
                "{} (which leads to {})",
                self.named.display(),
                self.canonical.display()
            )
        }
    }
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The record of known volumes of one user on this machine.
#[derive(Debug, Clone)]
pub struct KnownVolumes {
    dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordFile {
    version: u64,
    volumes: Vec<RecordEntry>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordEntry {
    volume_id: String,
    fingerprint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pending_fingerprint: Option<String>,
    cipherdirs: Vec<String>,
    first_seen: u64,
}

impl KnownVolumes {
    /// The record of the user running this process (see the module documentation).
    pub fn for_this_user() -> Result<Self> {
        Ok(Self::at(state_dir()?))
    }

    /// The record kept in `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The record file's path, for messages.
    pub fn path(&self) -> PathBuf {
        self.dir.join(RECORD_FILE)
    }

    /// Every volume remembered.
    pub fn list(&self) -> Result<Vec<KnownVolume>> {
        self.load()
    }

    /// What is remembered of the volume `volume_id`, if anything.
    pub fn get(&self, volume_id: &[u8; 16]) -> Result<Option<KnownVolume>> {
        Ok(self.load()?.into_iter().find(|v| &v.volume_id == volume_id))
    }

    /// Checks that the volume `volume_id`, opened from `place`, opened to the key whose
    /// fingerprint is `fp`, and remembers it. Refused ([`Error::KeyChanged`]) when the volume
    /// is known with another key, or when `place` held another volume before. On a first use,
    /// `first_use` runs before anything is remembered, and its error refuses the volume.
    /// `rekey_pending` says whether the volume has an interrupted rekey (its journal exists).
    pub fn check(
        &self,
        place: &Place,
        volume_id: &[u8; 16],
        fp: &KeyFingerprint,
        rekey_pending: bool,
        first_use: impl FnOnce() -> Result<()>,
    ) -> Result<Pinned> {
        let lock = match self.lock() {
            Ok(l) => l,
            Err(e) => return self.unsaved_or_known(volume_id, fp, place, e, first_use),
        };
        let mut all = self.load()?;
        let verdict = match all.iter().position(|v| &v.volume_id == volume_id) {
            Some(i) => {
                let v = &mut all[i];
                if v.fingerprint == *fp {
                    Pinned::Known
                } else if v.pending == Some(*fp) {
                    if !rekey_pending {
                        // The rekey this machine started has completed.
                        v.fingerprint = *fp;
                        v.pending = None;
                    }
                    Pinned::Known
                } else {
                    return Err(key_changed(v, fp, place));
                }
            }
            None => Pinned::FirstUse,
        };
        if let Some(other) = place.held_by_other(&all, volume_id) {
            return Err(place_changed(other, volume_id, place));
        }
        if verdict == Pinned::FirstUse {
            first_use()?;
            all.push(KnownVolume {
                volume_id: *volume_id,
                fingerprint: *fp,
                pending: None,
                cipherdirs: Vec::new(),
                first_seen: now(),
            });
        }
        remember_place(&mut all, volume_id, place);
        match self.save(&all, &lock) {
            Ok(()) => Ok(verdict),
            Err(e) if verdict == Pinned::FirstUse => Ok(Pinned::NotRemembered(format!(
                "cannot save {}: {e}",
                self.path().display()
            ))),
            // Known already: the new directory is simply not added this time.
            Err(_) => Ok(verdict),
        }
    }

    /// Without the lock (a read-only or missing state directory), a known volume can still be
    /// checked; a new one cannot be remembered.
    fn unsaved_or_known(
        &self,
        volume_id: &[u8; 16],
        fp: &KeyFingerprint,
        place: &Place,
        why: Error,
        first_use: impl FnOnce() -> Result<()>,
    ) -> Result<Pinned> {
        let all = self.load()?;
        let known = all.iter().find(|v| &v.volume_id == volume_id);
        if let Some(v) = known.filter(|v| v.fingerprint != *fp && v.pending != Some(*fp)) {
            return Err(key_changed(v, fp, place));
        }
        if let Some(other) = place.held_by_other(&all, volume_id) {
            return Err(place_changed(other, volume_id, place));
        }
        if known.is_some() {
            return Ok(Pinned::Known);
        }
        first_use()?;
        Ok(Pinned::NotRemembered(format!(
            "cannot write {}: {why}",
            self.path().display()
        )))
    }

    /// Remembers the volume `volume_id` at `place` with the key `fp`, replacing whatever
    /// was remembered for that volume or that place; returns the replaced entries. For a
    /// volume made here (`init`) and for `cloakfs known accept`.
    pub fn accept(
        &self,
        place: &Place,
        volume_id: &[u8; 16],
        fp: &KeyFingerprint,
    ) -> Result<Vec<KnownVolume>> {
        let lock = self.lock()?;
        let mut all = self.load()?;
        let mut replaced = Vec::new();
        let mut dirs = Vec::new();
        let mut first_seen = now();
        all.retain(|v| {
            if &v.volume_id == volume_id {
                replaced.push(v.clone());
                dirs.extend(v.cipherdirs.iter().cloned());
                first_seen = v.first_seen;
                false
            } else {
                if place
                    .held_by_other(std::slice::from_ref(v), volume_id)
                    .is_some()
                {
                    replaced.push(v.clone());
                }
                true
            }
        });
        if !replaced.iter().any(|v| &v.volume_id == volume_id) {
            first_seen = now();
        }
        all.push(KnownVolume {
            volume_id: *volume_id,
            fingerprint: *fp,
            pending: None,
            cipherdirs: dirs,
            first_seen,
        });
        remember_place(&mut all, volume_id, place);
        self.save(&all, &lock)?;
        Ok(replaced)
    }

    /// Forgets the volume `volume_id`; returns whether it was remembered.
    pub fn forget(&self, volume_id: &[u8; 16]) -> Result<bool> {
        let lock = self.lock()?;
        let mut all = self.load()?;
        let before = all.len();
        all.retain(|v| &v.volume_id != volume_id);
        if all.len() == before {
            return Ok(false);
        }
        self.save(&all, &lock)?;
        Ok(true)
    }

    /// A rekey on this machine is about to move the volume to the key `new`: both keys open
    /// it until [`KnownVolumes::finish_rekey`] or [`KnownVolumes::abort_rekey`].
    pub fn begin_rekey(&self, volume_id: &[u8; 16], new: &KeyFingerprint) -> Result<()> {
        self.update(volume_id, |v| v.pending = Some(*new))
    }

    /// The rekey completed: only the key `new` opens the volume from now on. A rekey resumed
    /// here that another machine started counts too: its journal held the new key wrapped
    /// under the old, pinned one.
    pub fn finish_rekey(&self, volume_id: &[u8; 16], new: &KeyFingerprint) -> Result<()> {
        self.update(volume_id, |v| {
            v.fingerprint = *new;
            v.pending = None;
        })
    }

    /// The rekey was rolled back: only the old key opens the volume.
    pub fn abort_rekey(&self, volume_id: &[u8; 16]) -> Result<()> {
        self.update(volume_id, |v| v.pending = None)
    }

    fn update(&self, volume_id: &[u8; 16], change: impl FnOnce(&mut KnownVolume)) -> Result<()> {
        let lock = self.lock()?;
        let mut all = self.load()?;
        if let Some(v) = all.iter_mut().find(|v| &v.volume_id == volume_id) {
            change(v);
            self.save(&all, &lock)?;
        }
        Ok(())
    }

    fn lock(&self) -> Result<File> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.dir.join(LOCK_FILE))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
            .map_err(std::io::Error::from)?;
        Ok(f)
    }

    fn load(&self) -> Result<Vec<KnownVolume>> {
        let path = self.path();
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(Vec::new())
            }
            Err(e) => return Err(record_error(&path, e)),
        };
        if f.metadata().map_err(|e| record_error(&path, e))?.len() > RECORD_MAX_BYTES {
            return Err(damaged_record(&path, "too large"));
        }
        let file: RecordFile = serde_json::from_reader(std::io::BufReader::new(f))
            .map_err(|e| damaged_record(&path, &e.to_string()))?;
        if file.version != RECORD_VERSION {
            return Err(damaged_record(
                &path,
                &format!("version {} (made by a newer cloakfs?)", file.version),
            ));
        }
        file.volumes
            .into_iter()
            .map(|e| {
                let fp = |t: &str| {
                    KeyFingerprint::parse(t).ok_or_else(|| damaged_record(&path, "bad fingerprint"))
                };
                Ok(KnownVolume {
                    volume_id: unb64_array(&e.volume_id)
                        .ok_or_else(|| damaged_record(&path, "bad volume ID"))?,
                    fingerprint: fp(&e.fingerprint)?,
                    pending: e.pending_fingerprint.as_deref().map(fp).transpose()?,
                    cipherdirs: e.cipherdirs.into_iter().map(PathBuf::from).collect(),
                    first_seen: e.first_seen,
                })
            })
            .collect()
    }

    /// Writes the record atomically (temporary file, fsync, rename, fsync directory); `_lock`
    /// proves the caller holds the lock.
    fn save(&self, all: &[KnownVolume], _lock: &File) -> Result<()> {
        let file = RecordFile {
            version: RECORD_VERSION,
            volumes: all
                .iter()
                .map(|v| RecordEntry {
                    volume_id: b64(&v.volume_id),
                    fingerprint: v.fingerprint.to_string(),
                    pending_fingerprint: v.pending.map(|p| p.to_string()),
                    // Only directories whose names are text can be written to JSON; the
                    // volume-ID check covers the others.
                    cipherdirs: v
                        .cipherdirs
                        .iter()
                        .filter_map(|d| d.to_str().map(String::from))
                        .collect(),
                    first_seen: v.first_seen,
                })
                .collect(),
        };
        let mut json = serde_json::to_string_pretty(&file).expect("record serializes");
        json.push('\n');
        let path = self.path();
        let tmp = self
            .dir
            .join(format!("{RECORD_FILE}.tmp.{}", std::process::id()));
        let result = (|| -> std::io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(json.as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            File::open(&self.dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map_err(|e| record_error(&path, e))
    }
}

fn key_changed(v: &KnownVolume, fp: &KeyFingerprint, place: &Place) -> Error {
    Error::KeyChanged(format!(
        "volume {} at {} now opens to a different master key (fingerprint {fp}) than this \
         machine remembers (fingerprint {}): its config may have been replaced by someone who \
         can write the cipher directory; if you rekeyed it on another machine, compare the \
         fingerprint there and run `cloakfs known accept {}`",
        b64(&v.volume_id),
        place,
        v.fingerprint,
        place.named.display()
    ))
}

fn place_changed(other: &KnownVolume, volume_id: &[u8; 16], place: &Place) -> Error {
    Error::KeyChanged(format!(
        "{place} held volume {} when this machine last opened it, and now holds volume {}: \
         its config may have been replaced, or the directory swapped, by someone who can write \
         the cipher directory or its parent; if you put volume {} there yourself, run \
         `cloakfs known accept {}`",
        b64(&other.volume_id),
        b64(volume_id),
        b64(volume_id),
        place.named.display()
    ))
}

/// Adds both paths of `place` to the volume `volume_id` and takes them from every other.
fn remember_place(all: &mut [KnownVolume], volume_id: &[u8; 16], place: &Place) {
    for v in all.iter_mut() {
        for dir in place.paths() {
            if &v.volume_id == volume_id {
                if !v.cipherdirs.iter().any(|d| d == dir) {
                    v.cipherdirs.push(dir.to_path_buf());
                }
            } else {
                v.cipherdirs.retain(|d| d != dir);
            }
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn record_error(path: &Path, e: std::io::Error) -> Error {
    Error::Io(std::io::Error::new(
        e.kind(),
        format!("record of known volumes {}: {e}", path.display()),
    ))
}

fn damaged_record(path: &Path, why: &str) -> Error {
    Error::Refused(format!(
        "record of known volumes {} is damaged ({why}): fix or remove it (removing it forgets \
         every volume this machine has opened)",
        path.display()
    ))
}

/// What the root of a cipher directory holds, judged with the volume's names key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootCensus {
    /// Entries that are the volume's: names that decrypt (and an adopted tree's plaintext).
    pub own: usize,
    /// Entries that are neither the volume's nor cloakfs's own (`cloakfs.*`, the scratch file
    /// of the extended-attribute check): names that do not decrypt under its key, and names
    /// with a dot, which no encrypted name has. A mount skips or refuses them.
    pub foreign: usize,
    /// One foreign name, for messages.
    pub example: Option<String>,
}

impl RootCensus {
    /// The foreign entries, for messages.
    pub fn foreign_entries(&self) -> String {
        format!(
            "{} entries that are not this volume's (names that do not decrypt under its key or \
             that no encrypted name has, such as {:?})",
            self.foreign,
            self.example.as_deref().unwrap_or_default()
        )
    }
}

/// Counts what the root of `cipherdir`, the volume's cipher directory, holds.
pub fn root_census(volume: &Volume, cipherdir: &Path) -> Result<RootCensus> {
    let root = volume.root_dir_id();
    let adopted = volume.config().params.adopted;
    volume.keep_plaintext_list(cipherdir);
    let mut census = RootCensus::default();
    for entry in fs::read_dir(cipherdir)? {
        let name = entry?.file_name();
        let raw = name.as_bytes();
        let class = volume
            .names()
            .classify_entry(Some(&root), raw, adopted, |b| {
                crate::tools::paths::read_sidecar(&cipherdir.join(names::sidecar_name(b)))
                    .map(|s| s.trim_end().to_string())
                    .map_err(|_| "no readable sidecar")
            });
        let foreign = match class {
            Classified::Encrypted(_) => false,
            // A plaintext entry the tree's manifest does not list is not the user's.
            Classified::Plain => !volume.plaintext_listed(Some(&root), raw),
            Classified::Undecryptable(_) => true,
            Classified::Internal => {
                !raw.starts_with(RESERVED_PREFIX.as_bytes())
                    && !raw.starts_with(crate::io::header::SCRATCH_PREFIX.as_bytes())
                    && !crate::sync_folder::is_client_metadata(raw)
            }
        };
        if foreign {
            census.foreign += 1;
            census
                .example
                .get_or_insert_with(|| name.to_string_lossy().into_owned());
        } else if matches!(class, Classified::Encrypted(_) | Classified::Plain) {
            census.own += 1;
        }
    }
    Ok(census)
}

/// Judges the first use of `volume` at `place` by what its root holds: refused
/// ([`Error::KeyChanged`]) when the root holds foreign entries and none of the volume's own
/// (old entries renamed aside under a replaced config would show as an empty volume);
/// otherwise a warning when it holds foreign entries at all.
pub fn vet_first_use(volume: &Volume, place: &Place) -> Result<Option<String>> {
    // A reverse view's config file is no cipher directory: it has no root to judge.
    if !place.canonical.is_dir() {
        return Ok(None);
    }
    let c = root_census(volume, &place.canonical)?;
    let id = b64(&volume.config().params.volume_id);
    let what = c.foreign_entries();
    match (c.foreign, c.own) {
        (0, _) => Ok(None),
        (_, 0) => Err(Error::KeyChanged(format!(
            "volume {id} at {place} is opened for the first time on this machine, and its root \
             holds {what} and none of its own: its config may have been replaced and the old \
             entries renamed aside; if they belong there, run `cloakfs known accept {}`",
            place.named.display()
        ))),
        _ => Ok(Some(format!(
            "the root of volume {id} at {place} holds {what}; the mount does not show them"
        ))),
    }
}

/// The state directory of the user running this process.
pub fn state_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os(STATE_DIR_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if rustix::process::geteuid().is_root() {
        return Ok(PathBuf::from("/var/lib/cloakfs"));
    }
    // $XDG_STATE_HOME if absolute, else ~/.local/state (home from $HOME or the passwd entry).
    dirs::state_dir().map(|d| d.join("cloakfs")).ok_or_else(|| {
        Error::Refused(format!(
            "no home directory to keep the record of known volumes in: set HOME, \
             XDG_STATE_HOME or {STATE_DIR_ENV}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(b: u8) -> KeyFingerprint {
        KeyFingerprint([b; 32])
    }

    fn check(
        k: &KnownVolumes,
        dir: &Path,
        id: &[u8; 16],
        fp: &KeyFingerprint,
        rekey_pending: bool,
    ) -> Result<Pinned> {
        k.check(&Place::of(dir), id, fp, rekey_pending, || Ok(()))
    }

    #[test]
    fn first_use_then_known_then_changed_key_refused() {
        let state = tempfile::tempdir().unwrap();
        let vol = tempfile::tempdir().unwrap();
        let k = KnownVolumes::at(state.path());
        let id = [7u8; 16];
        assert_eq!(
            check(&k, vol.path(), &id, &fp(1), false).unwrap(),
            Pinned::FirstUse
        );
        assert_eq!(
            check(&k, vol.path(), &id, &fp(1), false).unwrap(),
            Pinned::Known
        );
        let e = check(&k, vol.path(), &id, &fp(2), false).unwrap_err();
        assert!(matches!(e, Error::KeyChanged(_)), "{e}");
        assert!(e.to_string().contains("may have been replaced"), "{e}");
        // The refusal changed nothing.
        assert_eq!(k.get(&id).unwrap().unwrap().fingerprint, fp(1));
    }

    #[test]
    fn a_new_volume_id_in_a_known_directory_is_refused() {
        let state = tempfile::tempdir().unwrap();
        let vol = tempfile::tempdir().unwrap();
        let k = KnownVolumes::at(state.path());
        check(&k, vol.path(), &[1; 16], &fp(1), false).unwrap();
        let e = check(&k, vol.path(), &[2; 16], &fp(2), false).unwrap_err();
        assert!(matches!(e, Error::KeyChanged(_)), "{e}");
        // Accepting it (a volume made there on purpose) moves the directory to the new one.
        let replaced = k.accept(&Place::of(vol.path()), &[2; 16], &fp(2)).unwrap();
        assert_eq!(replaced.len(), 1);
        assert_eq!(
            check(&k, vol.path(), &[2; 16], &fp(2), false).unwrap(),
            Pinned::Known
        );
        // The old volume is still known by its ID, without the directory.
        assert!(k.get(&[1; 16]).unwrap().unwrap().cipherdirs.is_empty());
    }

    #[test]
    fn a_name_that_now_leads_to_another_volume_is_refused() {
        let state = tempfile::tempdir().unwrap();
        let base = tempfile::tempdir().unwrap();
        let (real, other, link) = (
            base.path().join("real"),
            base.path().join("other"),
            base.path().join("vault"),
        );
        fs::create_dir(&real).unwrap();
        fs::create_dir(&other).unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let k = KnownVolumes::at(state.path());
        check(&k, &link, &[1; 16], &fp(1), false).unwrap();
        // Both the name and where it led are remembered.
        let dirs = k.get(&[1; 16]).unwrap().unwrap().cipherdirs;
        assert_eq!(dirs, [link.clone(), real.clone()]);
        // The name now leads to an unknown volume: not a first use.
        fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&other, &link).unwrap();
        let e = check(&k, &link, &[2; 16], &fp(2), false).unwrap_err();
        assert!(matches!(e, Error::KeyChanged(_)), "{e}");
        assert!(e.to_string().contains("held volume"), "{e}");
        assert!(k.get(&[2; 16]).unwrap().is_none());
        // Named by its own path, that volume is a first use like any other.
        assert_eq!(
            check(&k, &other, &[2; 16], &fp(2), false).unwrap(),
            Pinned::FirstUse
        );
        // A relative name is remembered made absolute, symlinks kept.
        let place = Place::of(Path::new("some/relative/dir"));
        assert!(place.named.is_absolute() && place.named.ends_with("some/relative/dir"));
    }

    #[test]
    fn a_known_volume_in_a_directory_of_another_is_refused() {
        let state = tempfile::tempdir().unwrap();
        let (private, team) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let k = KnownVolumes::at(state.path());
        check(&k, private.path(), &[1; 16], &fp(1), false).unwrap();
        check(&k, team.path(), &[2; 16], &fp(2), false).unwrap();
        // The team volume's config copied over the private one's: refused, not moved.
        let e = check(&k, private.path(), &[2; 16], &fp(2), false).unwrap_err();
        assert!(e.to_string().contains("held volume"), "{e}");
        assert_eq!(
            k.get(&[1; 16]).unwrap().unwrap().cipherdirs,
            [private.path().to_path_buf()]
        );
        // Accepted on purpose, it is.
        k.accept(&Place::of(private.path()), &[2; 16], &fp(2))
            .unwrap();
        assert_eq!(
            check(&k, private.path(), &[2; 16], &fp(2), false).unwrap(),
            Pinned::Known
        );
    }

    #[test]
    fn a_first_use_refused_by_its_vetting_is_not_remembered() {
        let state = tempfile::tempdir().unwrap();
        let vol = tempfile::tempdir().unwrap();
        let k = KnownVolumes::at(state.path());
        let refuse = || Err(Error::KeyChanged("foreign entries".into()));
        let e = k
            .check(&Place::of(vol.path()), &[1; 16], &fp(1), false, refuse)
            .unwrap_err();
        assert!(e.to_string().contains("foreign entries"), "{e}");
        assert!(k.list().unwrap().is_empty());
        // A known volume is not vetted again.
        check(&k, vol.path(), &[1; 16], &fp(1), false).unwrap();
        assert_eq!(
            k.check(&Place::of(vol.path()), &[1; 16], &fp(1), false, refuse)
                .unwrap(),
            Pinned::Known
        );
    }

    #[test]
    fn a_rekey_opens_with_both_keys_until_it_ends() {
        let state = tempfile::tempdir().unwrap();
        let vol = tempfile::tempdir().unwrap();
        let k = KnownVolumes::at(state.path());
        let id = [3u8; 16];
        check(&k, vol.path(), &id, &fp(1), false).unwrap();
        k.begin_rekey(&id, &fp(2)).unwrap();
        assert_eq!(
            check(&k, vol.path(), &id, &fp(1), true).unwrap(),
            Pinned::Known
        );
        assert_eq!(
            check(&k, vol.path(), &id, &fp(2), true).unwrap(),
            Pinned::Known
        );
        // Completed while this machine did not record it (crash after the config swap): the
        // next unlock without a journal promotes the new key.
        assert_eq!(
            check(&k, vol.path(), &id, &fp(2), false).unwrap(),
            Pinned::Known
        );
        assert!(check(&k, vol.path(), &id, &fp(1), false).is_err());
        k.begin_rekey(&id, &fp(3)).unwrap();
        k.abort_rekey(&id).unwrap();
        assert!(check(&k, vol.path(), &id, &fp(3), false).is_err());
    }

    #[test]
    fn an_unwritable_state_dir_opens_a_new_volume_but_says_so() {
        let state = tempfile::tempdir().unwrap();
        let vol = tempfile::tempdir().unwrap();
        let k = KnownVolumes::at(state.path().join("missing/dir"));
        // A plain file where the directory should be: nothing can be created there.
        fs::write(state.path().join("missing"), b"x").unwrap();
        match check(&k, vol.path(), &[1; 16], &fp(1), false).unwrap() {
            Pinned::NotRemembered(why) => assert!(why.contains("cannot write"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_damaged_record_is_an_error_not_an_empty_one() {
        let state = tempfile::tempdir().unwrap();
        let vol = tempfile::tempdir().unwrap();
        fs::write(state.path().join(RECORD_FILE), b"{ not json").unwrap();
        let k = KnownVolumes::at(state.path());
        let e = check(&k, vol.path(), &[1; 16], &fp(1), false).unwrap_err();
        assert!(e.to_string().contains("is damaged"), "{e}");
    }
}
