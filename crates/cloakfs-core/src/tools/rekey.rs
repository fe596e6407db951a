//! Moving a volume to a fresh master key: every file, name, symlink target and `user.` xattr is
//! re-encrypted, directory IDs and the volume ID are kept, and the slot that unlocked is
//! re-wrapped around the new key.
//!
//! # Crash safety
//!
//! Every change to the cipher directory is one atomic, idempotent step, and the state of each
//! entry is told by authenticated encryption itself: an entry is converted if it opens under
//! the new key, not yet converted if it opens under the old one. So a rekey can be stopped at
//! any point (SIGINT, `kill -9`, power cut) and then resumed or rolled back without losing a
//! byte:
//!
//! 1. The journal `cloakfs.rekey` is written next to the config (temporary file, fsync, rename,
//!    fsync directory). It holds the new master key wrapped under a subkey of the old one and
//!    the complete new config (its slot re-wrapped, sealed with the new key). While it exists,
//!    mounting is refused ([`check_not_rekeying`]).
//! 2. Contents (pass 1, no names change): a file is re-encrypted under a fresh file ID into a
//!    temporary entry `cloakfs.rekey.tmp.<16 hex digits>` in its directory, with its mode, owner,
//!    times and xattrs; temporaries are made durable (syncfs) in batches and then renamed over
//!    the original (atomic). A file with several names (hard links) keeps its inode instead:
//!    the complete re-encrypted copy is made durable and renamed to
//!    `cloakfs.rekey.tmp.redo.<inode number>` (the commit point), then copied over the original
//!    in place and removed; a crash during the copy is finished from the redo file. Symlinks
//!    are replaced like files; xattrs of directories and of files whose content needs no
//!    conversion are re-encrypted in place (set the new, then remove the old).
//! 3. Names (pass 2): each entry is renamed from its old to its new encrypted name (`renameat2`
//!    with `RENAME_NOREPLACE`); a long name writes its new sidecar first and removes the old one
//!    last.
//! 4. Everything is made durable (syncfs), the new config replaces the old one atomically, and
//!    the journal is removed last.
//!
//! A resume redoes 2 to 4, skipping what opens under the new key; a rollback runs 2 and 3 with
//! the keys swapped and removes the journal. Leftover temporaries are removed first.
//!
//! For tests, the environment variable `CLOAKFS_REKEY_CRASH_AFTER=N` makes the process abort
//! (as `kill -9` would) right after its N-th atomic step.

use crate::crypto::keys::{label, MasterKey};
use crate::crypto::secret::SecretBytes;
use crate::error::{Error, Result};
use crate::format::config::{config_path, VolumeConfig, CONFIG_MAX_BYTES};
use crate::format::content::{FileHeader, FileId};
use crate::format::encoding::{b64, unb64};
use crate::format::names::{self, DirId, StoredName};
use crate::known_volumes::KnownVolumes;
use crate::tools::blocks::{BlockReader, BlockState, CHUNK_BLOCKS};
use crate::tools::walk::{
    internal_kind, is_payload, read_dir_id, InternalKind, Progress, REKEY_JOURNAL,
    REKEY_TEMP_PREFIX,
};
use crate::volume::Volume;
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::Aes256Gcm;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Version of the journal layout.
pub const JOURNAL_VERSION: u64 = 1;
/// HKDF label (of the old master key) of the key that wraps the new master key in the journal.
pub const LABEL_JOURNAL: &str = "rekey-journal";
/// First line of the journal's key-wrap AAD.
pub const JOURNAL_DOMAIN: &str = "cloakfs rekey v1\n";
/// Test hook: abort after this many atomic steps.
pub const CRASH_ENV: &str = "CLOAKFS_REKEY_CRASH_AFTER";
/// Temporaries are made durable and renamed in batches of at most this many files...
const BATCH_FILES: usize = 512;
/// ... or this many bytes.
const BATCH_BYTES: u64 = 64 << 20;

/// Where the rekey journal of the volume at `cipherdir` lives (next to the config).
pub fn journal_path(cipherdir: &Path) -> PathBuf {
    let conf = config_path(cipherdir);
    conf.parent().unwrap_or(Path::new(".")).join(REKEY_JOURNAL)
}

/// Refuses a volume whose rekey was interrupted: mount, fsck, export and the other tools call
/// this before touching the volume, since its entries are half under the old and half under
/// the new key until `cloakfs rekey --resume` or `--rollback` finishes.
pub fn check_not_rekeying(cipherdir: &Path) -> Result<()> {
    if journal_path(cipherdir).exists() {
        return Err(Error::Busy(format!(
            "a rekey of {} was interrupted: finish it with `cloakfs rekey --resume` (or undo it \
             with `cloakfs rekey --rollback`) first",
            cipherdir.display()
        )));
    }
    Ok(())
}

/// The mount point of a cloakfs mount of `cipherdir` (its FUSE source, or fsname, is the
/// cipher directory), per /proc/self/mountinfo. A mount given another `fsname=` is not found.
pub fn mounted_at(cipherdir: &Path) -> std::io::Result<Option<PathBuf>> {
    let want = std::fs::canonicalize(cipherdir)?;
    Ok(super::mounts::current()?
        .into_iter()
        .find(|m| m.fstype == super::mounts::CLOAKFS_TYPE && m.source == want)
        .map(|m| m.point))
}

/// Refuses a volume that is mounted.
pub fn check_not_mounted(cipherdir: &Path) -> Result<()> {
    if let Some(m) = mounted_at(cipherdir)? {
        return Err(Error::Busy(format!(
            "{} is mounted on {}: unmount it first",
            cipherdir.display(),
            m.display()
        )));
    }
    Ok(())
}

/// Holds an exclusive lock on the cipher directory: two rekeys, or a rekey and `fsck --repair`,
/// never run at once.
#[derive(Debug)]
pub struct VolumeLock(#[allow(dead_code)] File);

/// Takes the volume lock (an exclusive `flock` on the cipher directory), or refuses.
pub fn lock_volume(cipherdir: &Path) -> Result<VolumeLock> {
    let f = File::open(cipherdir)?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(VolumeLock(f)),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(Error::Busy(format!(
            "another cloakfs process is working on {}",
            cipherdir.display()
        ))),
        Err(e) => Err(Error::Io(e.into())),
    }
}

/// Options of a new rekey.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options<'a> {
    /// Remove the key slots other than the one that unlocked (they cannot be re-wrapped
    /// without their secrets) instead of refusing.
    pub drop_other_slots: bool,
    /// The machine's record of known volumes, moved to the new key along with the volume.
    pub known: Option<&'a KnownVolumes>,
}

/// How a rekey ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The volume now uses the new key.
    Completed,
    /// The volume is back on the old key.
    RolledBack,
    /// The new config was already in place (interrupted after the final swap); the journal
    /// was removed.
    AlreadyComplete,
}

/// What a rekey did.
#[derive(Debug, Clone)]
pub struct Summary {
    /// How it ended.
    pub outcome: Outcome,
    /// Files re-encrypted (backing inodes).
    pub files: u64,
    /// Of those, files with several names re-encrypted in place (through a redo file).
    pub in_place: u64,
    /// Backing bytes of the re-encrypted files.
    pub bytes: u64,
    /// Names re-encrypted.
    pub names: u64,
    /// Symlink targets re-encrypted.
    pub symlinks: u64,
    /// `user.` xattrs re-encrypted.
    pub xattrs: u64,
    /// Entries found already converted (on resume).
    pub already: u64,
    /// Slots removed from the config (`--drop-other-slots`).
    pub dropped_slots: Vec<u32>,
    /// Leftover temporaries removed (or, for redo files, finished).
    pub temporaries_removed: u64,
    /// Atomic steps taken (the unit of `CLOAKFS_REKEY_CRASH_AFTER`).
    pub steps: u64,
    /// Entries a rollback left as they were because they open under neither key.
    pub damaged: Vec<String>,
}

impl Summary {
    fn new(outcome: Outcome) -> Self {
        Self {
            outcome,
            files: 0,
            in_place: 0,
            bytes: 0,
            names: 0,
            symlinks: 0,
            xattrs: 0,
            already: 0,
            dropped_slots: Vec::new(),
            temporaries_removed: 0,
            steps: 0,
            damaged: Vec::new(),
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JournalFile {
    cloakfs_rekey: u64,
    volume_id: String,
    new_key: String,
    new_config: String,
}

fn journal_aad(volume_id: &[u8; 16], new_config: &str) -> Vec<u8> {
    format!(
        "{JOURNAL_DOMAIN}volume_id={}\nnew_config_sha256={}\n",
        b64(volume_id),
        b64(&Sha256::digest(new_config.as_bytes()))
    )
    .into_bytes()
}

fn journal_cipher(old: &MasterKey, volume_id: &[u8; 16]) -> Aes256Gcm {
    let k: SecretBytes<32> = old.subkey(volume_id, LABEL_JOURNAL);
    Aes256Gcm::new(k.expose().into())
}

fn write_journal(
    cipherdir: &Path,
    old: &MasterKey,
    new: &MasterKey,
    new_config: &VolumeConfig,
) -> Result<()> {
    let vid = new_config.params.volume_id;
    let text = new_config.to_json();
    let nonce: [u8; 12] = crate::crypto::random::array();
    let mut buf = SecretBytes::<32>::from_slice(new.expose());
    let tag = journal_cipher(old, &vid)
        .encrypt_in_place_detached(&nonce.into(), &journal_aad(&vid, &text), buf.expose_mut())
        .expect("32-byte wrap");
    let mut wrapped = nonce.to_vec();
    wrapped.extend_from_slice(buf.expose());
    wrapped.extend_from_slice(&tag);
    let j = JournalFile {
        cloakfs_rekey: JOURNAL_VERSION,
        volume_id: b64(&vid),
        new_key: b64(&wrapped),
        new_config: text,
    };
    let mut json = serde_json::to_string_pretty(&j).expect("strings serialize");
    json.push('\n');
    let path = journal_path(cipherdir);
    let dir = path
        .parent()
        .expect("journal has a directory")
        .to_path_buf();
    let tmp = dir.join(temp_name());
    let res = (|| -> Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(json.as_bytes())?;
        f.sync_all()?;
        rename_noreplace(&tmp, &path)?;
        sync_dir(&dir)?;
        Ok(())
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// The journal's contents once opened with the old master key.
struct Journal {
    new_key: MasterKey,
    new_config: VolumeConfig,
}

enum JournalState {
    /// The config on disk is still the old one: the journal opens with its key.
    Open(Journal),
    /// The config on disk is already the journal's new config.
    Swapped,
}

/// Largest rekey journal read, so a planted one cannot exhaust memory: it holds a config (at
/// most `CONFIG_MAX_BYTES`) as a JSON string, which escaping makes at most 6 times longer
/// (`\u0001`), and short fields.
const JOURNAL_MAX_BYTES: u64 = 6 * CONFIG_MAX_BYTES + 4096;

fn read_journal(cipherdir: &Path, volume: &Volume) -> Result<JournalState> {
    let path = journal_path(cipherdir);
    let damaged = |m: &str| Error::ConfigDamaged(format!("rekey journal {}: {m}", path.display()));
    let mut text = String::new();
    let read = File::open(&path).and_then(|f| {
        use std::io::Read;
        f.take(JOURNAL_MAX_BYTES + 1).read_to_string(&mut text)
    });
    match read {
        Ok(_) if text.len() as u64 > JOURNAL_MAX_BYTES => return Err(damaged("too large")),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::Refused(format!(
                "no interrupted rekey of {} (no {REKEY_JOURNAL})",
                cipherdir.display()
            )))
        }
        Err(e) => return Err(e.into()),
    }
    let j: JournalFile = serde_json::from_str(&text).map_err(|e| damaged(&e.to_string()))?;
    if j.cloakfs_rekey != JOURNAL_VERSION {
        return Err(Error::UnsupportedVersion {
            what: "rekey journal",
            found: j.cloakfs_rekey,
            supported: JOURNAL_VERSION,
        });
    }
    let new_config = VolumeConfig::parse(&j.new_config).map_err(|e| damaged(&e.to_string()))?;
    if &new_config == volume.config() {
        return Ok(JournalState::Swapped);
    }
    let vid = volume.config().params.volume_id;
    if j.volume_id != b64(&vid) || new_config.params != volume.config().params {
        return Err(damaged("it belongs to another volume"));
    }
    let wrapped = unb64(j.new_key.as_bytes())
        .filter(|w| w.len() == 60)
        .ok_or_else(|| damaged("new_key is not 60 base64url bytes"))?;
    let mut mk = SecretBytes::<32>::from_slice(wrapped[12..44].try_into().expect("32 bytes"));
    journal_cipher(volume.master_key(), &vid)
        .decrypt_in_place_detached(
            wrapped[..12].into(),
            &journal_aad(&vid, &j.new_config),
            mk.expose_mut(),
            wrapped[44..].into(),
        )
        .map_err(|_| damaged("it does not open with this volume's key (tampered?)"))?;
    let new_key = MasterKey::from_bytes(mk.expose());
    new_config
        .verify(&new_key)
        .map_err(|_| damaged("its new config does not verify"))?;
    Ok(JournalState::Open(Journal {
        new_key,
        new_config,
    }))
}

fn remove_journal(cipherdir: &Path) -> Result<()> {
    let path = journal_path(cipherdir);
    std::fs::remove_file(&path)?;
    sync_dir(path.parent().expect("journal has a directory"))?;
    Ok(())
}

/// Starts a rekey of the unlocked volume at `cipherdir` (see the module documentation).
pub fn start(
    volume: &Volume,
    cipherdir: &Path,
    opts: Options,
    progress: &dyn Progress,
) -> Result<Summary> {
    check_not_mounted(cipherdir)?;
    let _lock = lock_volume(cipherdir)?;
    check_not_rekeying(cipherdir)?;
    if volume.content().suite().header_len() == 0 {
        return Err(Error::Refused(format!(
            "rekey does not handle {} volumes yet (their file IDs are in xattrs): copy the \
             files into a new volume instead",
            volume.content().suite().name()
        )));
    }
    if volume.config().params.adopted {
        // Its manifest and plaintext entries are not rekeyed (FORMAT.md section 21.1).
        return Err(Error::Refused(
            "this adopted tree still holds plaintext entries: encrypt them first (`cloakfs \
             encrypt -r` on its mount), then rekey"
                .into(),
        ));
    }
    if config_path(cipherdir).parent() != Some(cipherdir) {
        return Err(Error::Refused(
            "rekey needs the config inside the cipher directory".into(),
        ));
    }
    let (slot_id, kek) = volume.unlocked_slot().ok_or_else(|| {
        Error::Refused(
            "this volume was not opened through a key slot that rekey can re-wrap (a volume \
             without a stored key cannot be rekeyed)"
                .into(),
        )
    })?;
    let config = volume.config();
    let others: Vec<u32> = config
        .slots()
        .iter()
        .map(|s| s.id())
        .filter(|&id| id != slot_id)
        .collect();
    if !others.is_empty() && !opts.drop_other_slots {
        let list: Vec<String> = others.iter().map(u32::to_string).collect();
        return Err(Error::Refused(format!(
            "the volume has other key slots ({}) besides the one you unlocked with ({slot_id}); \
             rekey can re-wrap only that one, since the others need their own secrets. Pass \
             --drop-other-slots to remove them (add them again with `cloakfs slots add` \
             afterwards)",
            list.join(", ")
        )));
    }
    preflight(volume, cipherdir)?;
    let new_key = MasterKey::generate();
    let mut new_config = config.clone();
    for id in &others {
        new_config.remove_slot(*id)?;
    }
    new_config.rewrap_slot(slot_id, kek, &new_key, crate::crypto::random::array())?;
    new_config.seal(&new_key);
    let new_volume = Volume::from_master_key(new_config.clone(), &new_key)?;
    let volume_id = config.params.volume_id;
    if let Some(k) = opts.known {
        // Before the journal: from then on a crash may leave either key in charge.
        k.begin_rekey(&volume_id, &new_key.fingerprint(&volume_id))?;
    }
    write_journal(cipherdir, volume.master_key(), &new_key, &new_config)?;
    let mut summary = Summary::new(Outcome::Completed);
    summary.dropped_slots = others;
    Engine::new(volume, &new_volume, cipherdir, progress, &mut summary).run()?;
    finish_forward(cipherdir, &new_config, &mut summary)?;
    if let Some(k) = opts.known {
        k.finish_rekey(&volume_id, &new_key.fingerprint(&volume_id))?;
    }
    Ok(summary)
}

/// Finishes an interrupted rekey (unlocked with the old secret, as the config on disk is still
/// the old one until the very end). `known` moves to the new key: the journal holds it
/// wrapped under the old key, so it is as trustworthy as the old one.
pub fn resume(
    volume: &Volume,
    cipherdir: &Path,
    known: Option<&KnownVolumes>,
    progress: &dyn Progress,
) -> Result<Summary> {
    check_not_mounted(cipherdir)?;
    let _lock = lock_volume(cipherdir)?;
    let volume_id = volume.config().params.volume_id;
    match read_journal(cipherdir, volume)? {
        JournalState::Swapped => already_complete(volume, cipherdir, known),
        JournalState::Open(j) => {
            let new_volume = Volume::from_master_key(j.new_config.clone(), &j.new_key)?;
            let mut summary = Summary::new(Outcome::Completed);
            Engine::new(volume, &new_volume, cipherdir, progress, &mut summary).run()?;
            finish_forward(cipherdir, &j.new_config, &mut summary)?;
            if let Some(k) = known {
                k.finish_rekey(&volume_id, &j.new_key.fingerprint(&volume_id))?;
            }
            Ok(summary)
        }
    }
}

/// The new config is in place (so `volume` is under the new key): only the journal is left.
fn already_complete(
    volume: &Volume,
    cipherdir: &Path,
    known: Option<&KnownVolumes>,
) -> Result<Summary> {
    remove_journal(cipherdir)?;
    if let Some(k) = known {
        let id = volume.config().params.volume_id;
        k.finish_rekey(&id, &volume.master_key().fingerprint(&id))?;
    }
    Ok(Summary::new(Outcome::AlreadyComplete))
}

/// Undoes an interrupted rekey: everything goes back under the old key, and the journal is
/// removed. If the new config was already in place, nothing can be undone: the journal is
/// removed and [`Outcome::AlreadyComplete`] returned.
pub fn rollback(
    volume: &Volume,
    cipherdir: &Path,
    known: Option<&KnownVolumes>,
    progress: &dyn Progress,
) -> Result<Summary> {
    check_not_mounted(cipherdir)?;
    let _lock = lock_volume(cipherdir)?;
    let volume_id = volume.config().params.volume_id;
    match read_journal(cipherdir, volume)? {
        JournalState::Swapped => already_complete(volume, cipherdir, known),
        JournalState::Open(j) => {
            let new_volume = Volume::from_master_key(j.new_config.clone(), &j.new_key)?;
            let mut summary = Summary::new(Outcome::RolledBack);
            Engine::new(&new_volume, volume, cipherdir, progress, &mut summary).run()?;
            sync_fs(cipherdir)?;
            remove_journal(cipherdir)?;
            if let Some(k) = known {
                k.abort_rekey(&volume_id)?;
            }
            Ok(summary)
        }
    }
}

/// Makes everything durable, swaps in the new config (atomic), then removes the journal. The
/// swap counts as one more step for the crash test hook.
fn finish_forward(
    cipherdir: &Path,
    new_config: &VolumeConfig,
    summary: &mut Summary,
) -> Result<()> {
    sync_fs(cipherdir)?;
    new_config.save(cipherdir)?;
    summary.steps += 1;
    let crash = std::env::var(CRASH_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    if crash == Some(summary.steps) {
        std::process::abort();
    }
    remove_journal(cipherdir)
}

/// Refuses to start on a volume with unreadable names or directories (a rekey could not
/// convert them): `cloakfs fsck` shows them.
///
/// It also refuses what a sync client left that rekey does not convert: a directory with
/// several IDs (a copy of its `cloakfs.dirid`: the names made under the copy's ID would no
/// longer open, `fsck --repair` merges them first) and conflict copies of entries (their
/// backing names follow their original's, and their contents would stay under the old key).
fn preflight(volume: &Volume, cipherdir: &Path) -> Result<()> {
    use crate::tools::walk::{display_plain, Item};
    let mut conflict = None;
    for item in crate::tools::walk::Walker::new(volume, cipherdir) {
        match item {
            Item::Bad(b) => {
                return Err(Error::Refused(format!(
                    "{}: {}; rekey would not be able to convert it: run `cloakfs fsck` first",
                    b.location(),
                    b.detail
                )));
            }
            Item::Internal(i) if i.kind == InternalKind::DirIdCopy => {
                return Err(Error::Refused(format!(
                    "{}: directory has several IDs ({} is a sync client's copy of its {}); \
                     rekey does not convert the names made under it: run `cloakfs fsck \
                     --repair` first, which merges them under one",
                    display_plain(&i.dir_plain),
                    i.backing.file_name().unwrap_or_default().to_string_lossy(),
                    names::DIRID_FILE
                )));
            }
            Item::Entry(e) if conflict.is_none() => {
                if let Some((copy, original)) = e.conflict.as_deref() {
                    conflict = Some(format!(
                        "{}: a sync client's conflict copy of {} ({}); rekey does not convert \
                         conflict copies: keep it (rename it over the original, or to a name \
                         of its own) or delete it, through the mount, then rekey",
                        display_plain(&e.plain),
                        display_plain(original),
                        copy.client.label()
                    ));
                }
            }
            _ => {}
        }
    }
    match conflict {
        Some(m) => Err(Error::Refused(m)),
        None => Ok(()),
    }
}

/// Makes everything written to the cipher directory's file system durable.
fn sync_fs(cipherdir: &Path) -> Result<()> {
    rustix::fs::syncfs(File::open(cipherdir)?).map_err(std::io::Error::from)?;
    Ok(())
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    rustix::fs::renameat_with(
        rustix::fs::CWD,
        from,
        rustix::fs::CWD,
        to,
        rustix::fs::RenameFlags::NOREPLACE,
    )?;
    Ok(())
}

fn temp_name() -> String {
    let r: [u8; 8] = crate::crypto::random::array();
    let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
    format!("{REKEY_TEMP_PREFIX}{hex}")
}

/// Which key an entry opens under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Already under the target key (or nothing keyed in it).
    Done,
    /// Still under the source key.
    Todo,
}

struct Engine<'a> {
    from: &'a Volume,
    to: &'a Volume,
    root: PathBuf,
    progress: &'a dyn Progress,
    summary: &'a mut Summary,
    crash_after: Option<u64>,
    steps: u64,
    rollback: bool,
    reported: u64,
    pending: Vec<(PathBuf, PathBuf)>,
    pending_bytes: u64,
    plain: Vec<u8>,
    sealed: Vec<u8>,
    out: Vec<u8>,
}

fn tampered_at(what: &Path, m: impl std::fmt::Display) -> Error {
    Error::Tampered(format!("{}: {m}", what.display()))
}

impl<'a> Engine<'a> {
    fn new(
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
    fn step(&mut self) {
        self.steps += 1;
        self.summary.steps = self.steps;
        if self.crash_after == Some(self.steps) {
            std::process::abort();
        }
    }

    fn check_cancel(&mut self) -> Result<()> {
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

    fn run(mut self) -> Result<()> {
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
    fn prescan(&mut self) -> Result<(u64, u64)> {
        let mut bytes = 0;
        let mut entries = 0;
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let mut names: Vec<OsString> = std::fs::read_dir(&dir)?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<std::io::Result<_>>()?;
            names.sort();
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

    /// Pass 1: file contents, symlink targets and xattrs (and a sharing volume's retirement
    /// records). No name changes.
    fn contents(&mut self) -> Result<()> {
        self.xattrs(&self.root.clone())?;
        if self.to.is_sharing() {
            let key = |v: &Volume| {
                v.master_key()
                    .subkey(&v.config().params.volume_id, label::SHARE_RETIRED)
            };
            crate::io::retired::rekey_records(&self.root, key(self.from), key(self.to))?;
        }
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let mut names: Vec<OsString> = std::fs::read_dir(&dir)?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<std::io::Result<_>>()?;
            names.sort();
            for name in names.iter().filter(|n| is_payload(n)) {
                self.check_cancel()?;
                let path = dir.join(name);
                let meta = std::fs::symlink_metadata(&path)?;
                let t = meta.file_type();
                if t.is_file() && self.to.is_sharing() {
                    // Its contents are under its own file key (FORMAT.md 18), not the master
                    // key: only its header's volume MAC and its xattrs move. (`share remove`
                    // gives a file a new key.)
                    match crate::tools::share::reseal_header(self.from, self.to, &path) {
                        Ok(_) => {}
                        Err(Error::Io(e)) => return Err(e.into()),
                        Err(e) => self.damaged(&path, e)?,
                    }
                    self.xattrs(&path)?;
                    self.progress.advance(meta.len(), 1);
                    continue;
                }
                if t.is_file() {
                    self.reported = 0;
                    self.file(&path, &meta)?;
                    self.progress
                        .advance(meta.len().saturating_sub(self.reported), 1);
                    continue;
                }
                if t.is_symlink() {
                    self.symlink(&path, &meta)?;
                } else {
                    self.xattrs(&path)?;
                }
                if t.is_dir() {
                    stack.push(path);
                }
                self.progress.advance(0, 1);
            }
        }
        Ok(())
    }

    /// The state of a file's content: under the target key, the source key, or neither.
    fn file_state(&mut self, path: &Path) -> Result<Option<(State, BlockReader)>> {
        let to = match BlockReader::open(self.to.content(), File::open(path)?) {
            Ok(r) => r,
            Err(Error::Io(e)) => return Err(e.into()),
            Err(e) => return self.damaged(path, e).map(|()| None),
        };
        if let Some(d) = to.damage() {
            return self.damaged(path, d).map(|()| None);
        }
        let mut b = 0;
        while b < to.block_count() {
            let c = to.read_chunk(b, 16, &mut self.out, &mut self.sealed)?;
            match c.states.iter().position(|s| *s != BlockState::Hole) {
                Some(i) if c.states[i] == BlockState::Data => return Ok(Some((State::Done, to))),
                Some(i) => {
                    let from = BlockReader::open(self.from.content(), File::open(path)?)?;
                    let first = b + i as u64;
                    let c = from.read_chunk(first, 1, &mut self.out, &mut self.sealed)?;
                    if c.states.first() == Some(&BlockState::Data) {
                        return Ok(Some((State::Todo, from)));
                    }
                    let e = format!("block {first} opens under neither key (tampered or damaged)");
                    return self.damaged(path, e).map(|()| None);
                }
                None => b += c.states.len() as u64,
            }
        }
        Ok(None) // empty, or only holes: nothing is keyed
    }

    /// An entry that opens under neither key. A rekey stops there (converting the rest and
    /// swapping keys would make its readable parts unreadable); a rollback leaves it as it is
    /// (it was never converted: a rekey only ever writes complete, verified copies).
    fn damaged(&mut self, path: &Path, m: impl std::fmt::Display) -> Result<()> {
        if self.rollback {
            self.summary
                .damaged
                .push(format!("{}: {m}", path.display()));
            return Ok(());
        }
        Err(tampered_at(
            path,
            format!(
                "{m}; rekey stopped: roll back (`cloakfs rekey --rollback`), then restore or \
                 remove the damaged entry (see `cloakfs fsck`)"
            ),
        ))
    }

    fn file(&mut self, path: &Path, meta: &Metadata) -> Result<()> {
        let (state, r) = match self.file_state(path)? {
            None => return self.xattrs(path),
            Some(x) => x,
        };
        if state == State::Done {
            self.summary.already += 1;
            return self.xattrs(path);
        }
        let dir = path.parent().expect("entries have a parent");
        let tmp = dir.join(temp_name());
        let in_place = meta.nlink() > 1;
        if let Err(e) = self.reencrypt(&r, &tmp, path, meta, !in_place) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        self.summary.files += 1;
        self.summary.bytes += meta.len();
        if in_place {
            // Several names share this inode: keep it, so they all stay one file.
            File::open(&tmp)?.sync_all()?;
            let redo = dir.join(format!("{REDO_PREFIX}{}", meta.ino()));
            std::fs::rename(&tmp, &redo)?;
            sync_dir(dir)?;
            self.step();
            self.apply_redo(&redo, path)?;
            self.summary.in_place += 1;
            return self.xattrs(path);
        }
        self.pending_bytes += meta.len();
        self.pending.push((tmp, path.to_path_buf()));
        if self.pending.len() >= BATCH_FILES || self.pending_bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Copies a committed redo file over the inode it was made for (same length and block
    /// layout; holes punched where the copy has them), makes that durable, then removes the
    /// redo file. Idempotent: a crash at any point is finished by doing it again.
    fn apply_redo(&mut self, redo: &Path, target: &Path) -> Result<()> {
        let src = File::open(redo)?;
        let smeta = src.metadata()?;
        let dst = std::fs::OpenOptions::new().write(true).open(target)?;
        let cbs = self.to.content().layout().cipher_block_size();
        let len = smeta.len();
        let header = crate::format::layout::HEADER_LEN;
        let mut buf = vec![0u8; (cbs * CHUNK_BLOCKS) as usize];
        let mut h = [0u8; crate::format::layout::HEADER_LEN as usize];
        src.read_exact_at(&mut h[..header.min(len) as usize], 0)?;
        dst.write_all_at(&h[..header.min(len) as usize], 0)?;
        let mut off = header;
        while off < len {
            let n = (len - off).min(buf.len() as u64) as usize;
            src.read_exact_at(&mut buf[..n], off)?;
            for (i, block) in buf[..n].chunks(cbs as usize).enumerate() {
                let at = off + i as u64 * cbs;
                if block.len() as u64 == cbs && block.iter().all(|&b| b == 0) {
                    punch_hole(&dst, at, cbs)?;
                } else {
                    dst.write_all_at(block, at)?;
                }
            }
            off += n as u64;
        }
        dst.set_len(len)?;
        rustix::fs::futimens(&dst, &timestamps(&smeta)).map_err(std::io::Error::from)?;
        dst.sync_all()?;
        std::fs::remove_file(redo)?;
        self.step();
        Ok(())
    }

    /// Writes the re-encrypted copy of `r` (backing file `path`) to `tmp` under a fresh file ID,
    /// with the same holes and times and, if `with_meta`, the same owner, mode and xattrs.
    fn reencrypt(
        &mut self,
        r: &BlockReader,
        tmp: &Path,
        path: &Path,
        meta: &Metadata,
        with_meta: bool,
    ) -> Result<()> {
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)?;
        let new_id = FileId::random();
        out.write_all_at(&FileHeader { id: new_id }.to_bytes(), 0)?;
        let cipher = self.to.content().file_cipher(new_id);
        let layout = r.layout();
        let (bs, cbs) = (
            layout.block_size() as usize,
            layout.cipher_block_size() as usize,
        );
        let mut b = 0;
        while b < r.block_count() {
            let chunk = r.read_chunk(b, CHUNK_BLOCKS, &mut self.plain, &mut self.sealed)?;
            if let Some(bad) = chunk.first_failure() {
                return Err(tampered_at(
                    path,
                    format!(
                        "block {bad} fails authentication; rekey stopped: roll back \
                         (`cloakfs rekey --rollback`), then restore or remove the damaged file \
                         (see `cloakfs fsck`)"
                    ),
                ));
            }
            self.out.clear();
            self.out.resize(self.sealed.len(), 0);
            // One getrandom(2) for the chunk (holes leave their nonce unused).
            let nonces = cipher.fresh_nonces(chunk.states.len());
            self.out
                .par_chunks_mut(cbs)
                .zip(self.plain.par_chunks(bs))
                .zip(chunk.states.par_iter())
                .zip(nonces)
                .enumerate()
                .for_each(|(i, (((o, p), s), nonce))| {
                    if *s == BlockState::Data {
                        cipher.seal_fresh(b + i as u64, nonce, p, o);
                    }
                });
            // Write runs of data blocks; holes stay holes.
            let base = layout.cipher_offset(b);
            let n = chunk.states.len();
            let mut i = 0;
            while i < n {
                if chunk.states[i] == BlockState::Hole {
                    i += 1;
                    continue;
                }
                let start = i;
                while i < n && chunk.states[i] == BlockState::Data {
                    i += 1;
                }
                let s = start * cbs;
                let e = (i * cbs).min(self.out.len());
                out.write_all_at(&self.out[s..e], base + s as u64)?;
            }
            b += n as u64;
            self.progress.advance(self.sealed.len() as u64, 0);
            self.reported += self.sealed.len() as u64;
        }
        out.set_len(r.backing_len())?;
        if with_meta {
            // Owner first (chown clears set-id bits), then mode and xattrs.
            let _ = rustix::fs::fchown(
                &out,
                Some(rustix::fs::Uid::from_raw(meta.uid())),
                Some(rustix::fs::Gid::from_raw(meta.gid())),
            );
            rustix::fs::fchmod(&out, rustix::fs::Mode::from_raw_mode(meta.mode() & 0o7777))
                .map_err(std::io::Error::from)?;
            self.copy_xattrs(path, tmp)?;
        }
        rustix::fs::futimens(&out, &timestamps(meta)).map_err(std::io::Error::from)?;
        Ok(())
    }

    /// Makes the pending temporaries durable, then renames each over its original.
    fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        sync_fs(&self.root)?;
        for (tmp, path) in std::mem::take(&mut self.pending) {
            std::fs::rename(&tmp, &path)?;
            self.step();
        }
        self.pending_bytes = 0;
        Ok(())
    }

    fn symlink(&mut self, path: &Path, meta: &Metadata) -> Result<()> {
        use crate::io::long_targets;
        let stored = std::fs::read_link(path)?;
        let stored = stored.as_os_str().as_bytes();
        if long_targets::read_target_at(self.to.meta(), &self.root, stored).is_ok() {
            self.summary.already += 1;
            return Ok(());
        }
        let target = match long_targets::read_target_at(self.from.meta(), &self.root, stored) {
            Ok(t) => t,
            Err(e) => return self.damaged(path, e),
        };
        let new = self.to.meta().encrypt_symlink(&target)?;
        // A long target's new file is durable before the symlink points to it; the old one
        // goes once its last symlink does (a crash in between leaves an unreferenced file,
        // which fsck --repair removes).
        long_targets::store_at(&self.root, &new)?;
        let old_long = crate::format::meta::long_target_name(stored)
            .filter(|_| meta.nlink() == 1)
            .map(str::to_string);
        let tmp = path
            .parent()
            .expect("entries have a parent")
            .join(temp_name());
        std::os::unix::fs::symlink(new.backing_target(), &tmp)?;
        let _ = std::os::unix::fs::lchown(&tmp, Some(meta.uid()), Some(meta.gid()));
        let _ = crate::tools::export::set_times_nofollow(&tmp, meta);
        if let Err(e) = std::fs::rename(&tmp, path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        if let Some(old) = old_long {
            let root = std::fs::File::open(&self.root)?;
            long_targets::remove(std::os::fd::AsFd::as_fd(&root), &old);
        }
        self.step();
        self.summary.symlinks += 1;
        Ok(())
    }

    /// Decides which key a `user.` xattr opens under; returns its plaintext name and value if
    /// it needs converting.
    fn xattr_state(&mut self, path: &Path, stored: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let value = crate::io::xattrs::get(path, stored)?;
        let to = self.to.meta();
        if to.decrypt_xattr_name(stored).is_ok() && to.decrypt_xattr_value(stored, &value).is_ok() {
            return Ok(None);
        }
        let from = self.from.meta();
        match (
            from.decrypt_xattr_name(stored),
            from.decrypt_xattr_value(stored, &value),
        ) {
            (Ok(n), Ok(v)) => Ok(Some((n, v))),
            _ => {
                let m = format!(
                    "xattr {} opens under neither key",
                    String::from_utf8_lossy(stored)
                );
                self.damaged(path, m).map(|()| None)
            }
        }
    }

    /// Re-encrypts the `user.` xattrs of `path` in place.
    fn xattrs(&mut self, path: &Path) -> Result<()> {
        for stored in crate::io::xattrs::list(path)?
            .into_iter()
            .filter(|n| crate::io::xattrs::is_user(n))
        {
            let Some((name, value)) = self.xattr_state(path, &stored)? else {
                continue;
            };
            let meta = self.to.meta();
            let new_name = meta.encrypt_xattr_name(&name)?.expect("a user. name");
            let new_value = meta.encrypt_xattr_value(&new_name, &value)?;
            crate::io::xattrs::set(path, &new_name, &new_value)?;
            self.step();
            crate::io::xattrs::remove(path, &stored)?;
            self.step();
            self.summary.xattrs += 1;
        }
        Ok(())
    }

    /// Copies every xattr of `src` to `dst`, `user.` ones re-encrypted under the target key.
    /// Security labels the process may not set are skipped.
    fn copy_xattrs(&mut self, src: &Path, dst: &Path) -> Result<()> {
        for stored in crate::io::xattrs::list(src)? {
            if !crate::io::xattrs::is_user(&stored) {
                let v = crate::io::xattrs::get(src, &stored)?;
                match crate::io::xattrs::set(dst, &stored, &v) {
                    Err(_) if stored.starts_with(b"security.") => {}
                    r => r?,
                }
                continue;
            }
            let (name, value) = match self.xattr_state(src, &stored)? {
                Some(x) => x,
                None => {
                    let to = self.to.meta();
                    let v = crate::io::xattrs::get(src, &stored)?;
                    match (
                        to.decrypt_xattr_name(&stored),
                        to.decrypt_xattr_value(&stored, &v),
                    ) {
                        (Ok(n), Ok(v)) => (n, v),
                        _ => {
                            // Damaged (a rollback keeps it): copied as it is.
                            crate::io::xattrs::set(dst, &stored, &v)?;
                            continue;
                        }
                    }
                }
            };
            let meta = self.to.meta();
            let new_name = meta.encrypt_xattr_name(&name)?.expect("a user. name");
            let new_value = meta.encrypt_xattr_value(&new_name, &value)?;
            crate::io::xattrs::set(dst, &new_name, &new_value)?;
            self.summary.xattrs += 1;
        }
        Ok(())
    }

    /// Pass 2: every name, directory by directory. Directory IDs stay; only the key changes.
    fn names(&mut self) -> Result<()> {
        let mut stack: Vec<PathBuf> = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let dir_id = if dir == self.root {
                self.to.root_dir_id()
            } else {
                read_dir_id(&dir).map_err(|(_, m)| tampered_at(&dir, m))?
            };
            let mut names: Vec<OsString> = std::fs::read_dir(&dir)?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<std::io::Result<_>>()?;
            names.sort();
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
    fn name(&mut self, dir: &Path, dir_id: &DirId, name: &OsStr) -> Result<OsString> {
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
    fn orphan_sidecars(&mut self, dir: &Path, dir_id: &DirId) -> Result<()> {
        let names: Vec<OsString> = std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()?;
        let longs: BTreeSet<&OsStr> = names
            .iter()
            .filter(|n| {
                matches!(
                    n.to_str().map(names::classify),
                    Some(names::EntryKind::Long(_))
                )
            })
            .map(OsString::as_os_str)
            .collect();
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

/// Prefix of a committed in-place conversion (followed by the inode number).
const REDO_PREFIX: &str = "cloakfs.rekey.tmp.redo.";

/// The entry of `dir` (among `names`) that is the regular file with inode number `ino`.
fn find_inode(dir: &Path, names: &[OsString], ino: u64) -> Option<PathBuf> {
    names
        .iter()
        .filter(|n| is_payload(n))
        .map(|n| dir.join(n))
        .find(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file() && m.ino() == ino))
}

fn timestamps(meta: &Metadata) -> rustix::fs::Timestamps {
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
fn punch_hole(f: &File, off: u64, len: u64) -> std::io::Result<()> {
    use rustix::fs::FallocateFlags as F;
    match rustix::fs::fallocate(f, F::PUNCH_HOLE | F::KEEP_SIZE, off, len) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP) | Err(rustix::io::Errno::NOSYS) => {
            f.write_all_at(&vec![0u8; len as usize], off)
        }
        Err(e) => Err(e.into()),
    }
}
