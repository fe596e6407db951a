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

mod contents;
mod engine;
mod journal;
mod renames;

use crate::crypto::keys::MasterKey;
use crate::error::{Error, Result};
use crate::format::config::{config_path, VolumeConfig};
use crate::format::names::{self};
use crate::known_volumes::KnownVolumes;
use crate::tools::walk::{InternalKind, Progress, REKEY_JOURNAL};
use crate::volume::Volume;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::tools::mounts::check_not_mounted;
pub use engine::CRASH_ENV;
use engine::{sync_fs, Engine};
use journal::{read_journal, remove_journal, write_journal, JournalState};
pub use journal::{JOURNAL_DOMAIN, JOURNAL_VERSION, LABEL_JOURNAL};

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
