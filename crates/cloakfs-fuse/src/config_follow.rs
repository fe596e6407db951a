//! Following the volume's config (`cloakfs.conf`) under a running mount.
//!
//! In a sync folder another device may change the config while this one has the volume
//! mounted: new key slots (`passwd`, `slots add`, `slots remove`), other volume fields
//! (`upgrade`), a new master key (`rekey`), and so may a storage attacker; a sync client may
//! also leave it half written for a moment. The mount keeps the keys it was unlocked with, so it
//! must never write under them into a volume whose config says otherwise. At most once a second,
//! when a request is about to change something (and when a directory is listed), the config is
//! stat'ed; a new version of it is read and judged against the config the mount runs with
//! ([`judge`]):
//!
//! - the same config, or only its key slots changed (its MAC still verifies under this mount's
//!   master key and every volume field is the same): nothing changes for the mount;
//! - not a config (yet): missing, half written, damaged: not acted on, and read again once it
//!   changes; one warning per such episode;
//! - anything else: another master key (a rekey, or a replaced config: the two cannot be told
//!   apart without the new key), another volume, other volume fields, a format this build does
//!   not read: writes are refused from then on, reads go on, one error line says why and to
//!   remount. So does a rekey journal (`cloakfs.rekey`) appearing: a rekey under way elsewhere,
//!   re-encrypting the files as they arrive.
//!
//! Refused writes get EROFS: the mount has become read-only, which applications know how to
//! report ("Read-only file system") and which is true of every change, whatever key it would
//! use; EIO would say that the storage failed, and that reads fail too, neither of which is so.
//! A refusal lasts until the unmount: the mount's keys do not become right again.

use crate::fs::CloakFs;
use crate::sys::{self, FileVersion, Res};
use cloakfs_core::crypto::keys::MasterKey;
use cloakfs_core::format::config::{VolumeConfig, CONFIG_FILE, CONFIG_MAX_BYTES};
use cloakfs_core::tools::walk::REKEY_JOURNAL;
use fuser::{Errno, INodeNo};
use rustix::fd::BorrowedFd;
use rustix::fs::AtFlags;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Longest time between two looks at the config while requests come.
const RECHECK: Duration = Duration::from_secs(1);

/// What the mount knows of its config on disk.
#[derive(Debug)]
pub(crate) struct ConfigWatch {
    /// When the watch began: `next_check` counts from here.
    started: Instant,
    /// Milliseconds after `started` before which the config is not looked at again.
    next_check: AtomicU64,
    /// Why writes are refused, once they are.
    refused: OnceLock<String>,
    seen: Mutex<Seen>,
    /// How many times the config was looked at (one stat each, and a read when it changed).
    checks: AtomicU64,
}

#[derive(Debug)]
struct Seen {
    /// The config the mount runs with (the one it was unlocked with, or that config with
    /// other key slots).
    config: VolumeConfig,
    /// The version of the file last read (None: not read yet, or its read failed).
    version: Option<FileVersion>,
    /// Whether the version on disk was reported as not a config.
    unreadable: bool,
}

/// What a config read from disk means to a mount running with another.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The same config.
    Same,
    /// Only the key slots changed: the mount goes on with its keys.
    SlotsChanged,
    /// Not a config (yet), for this reason: not acted on.
    Unreadable(String),
    /// The mount must stop writing, for this reason.
    Stop(String),
}

/// Judges `read`, the config now on disk, for a mount running with `current` under master
/// key `mk`.
pub(crate) fn judge(
    current: &VolumeConfig,
    mk: &MasterKey,
    read: &cloakfs_core::Result<VolumeConfig>,
) -> Verdict {
    use cloakfs_core::Error as E;
    let new = match read {
        Ok(c) => c,
        Err(E::UnsupportedVersion {
            what,
            found,
            supported,
        }) => {
            return Verdict::Stop(format!(
                "the volume was upgraded by a newer cloakfs ({what} version {found}; this one \
                 reads {supported})"
            ))
        }
        Err(e) => return Verdict::Unreadable(e.to_string()),
    };
    if new == current {
        return Verdict::Same;
    }
    if new.params.volume_id != current.params.volume_id {
        return Verdict::Stop(format!(
            "it is now the config of another volume (ID {})",
            cloakfs_core::text::b64(&new.params.volume_id)
        ));
    }
    if new.verify(mk).is_err() {
        return Verdict::Stop(
            "the volume was rekeyed on another device, or its config replaced (it no longer \
             authenticates under this mount's master key)"
                .into(),
        );
    }
    let (old_fields, new_fields) = (current.volume_fields(), new.volume_fields());
    if old_fields != new_fields {
        let mut changed: Vec<&str> = old_fields
            .keys()
            .chain(new_fields.keys())
            .filter(|k| old_fields.get(*k) != new_fields.get(*k))
            .map(String::as_str)
            .collect();
        changed.dedup();
        return Verdict::Stop(format!(
            "the volume's format was changed on another device (cloakfs upgrade, encrypt): {}",
            changed.join(", ")
        ));
    }
    Verdict::SlotsChanged
}

impl ConfigWatch {
    /// A watch of a mount running with `config`.
    pub(crate) fn new(config: VolumeConfig) -> Self {
        Self {
            started: Instant::now(),
            next_check: AtomicU64::new(0),
            refused: OnceLock::new(),
            seen: Mutex::new(Seen {
                config,
                version: None,
                unreadable: false,
            }),
            checks: AtomicU64::new(0),
        }
    }

    /// Whether it is time to look at the config again; true for one caller only.
    fn due(&self) -> bool {
        let now = self.started.elapsed().as_millis() as u64;
        let next = self.next_check.load(Ordering::Relaxed);
        now >= next
            && self
                .next_check
                .compare_exchange(
                    next,
                    now + RECHECK.as_millis() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Makes `config`, just written by this mount, the one it runs with; the next change
    /// looks at the file again at once.
    pub(crate) fn wrote(&self, config: VolumeConfig) {
        let mut seen = self.lock();
        seen.config = config;
        seen.version = None;
        self.next_check.store(0, Ordering::Relaxed);
    }

    /// How many times the config was looked at.
    pub(crate) fn checks(&self) -> u64 {
        self.checks.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl CloakFs {
    /// Refuses a change (EROFS) once the config changed in a way this mount cannot follow;
    /// looks at the config first if it is time to.
    pub(crate) fn follow_config(&self) -> Res<()> {
        let watch = &self.config_watch;
        if watch.refused.get().is_none() && watch.due() {
            self.recheck_config();
        }
        match watch.refused.get() {
            Some(_) => Err(Errno::EROFS),
            None => Ok(()),
        }
    }

    /// Looks at the rekey journal and the config, and acts on what changed.
    fn recheck_config(&self) {
        let Ok(root) = self.node(INodeNo(self.inodes.root())) else {
            return;
        };
        let dir = root.fd();
        let watch = &self.config_watch;
        watch.checks.fetch_add(1, Ordering::Relaxed);
        if rustix::fs::statat(dir, REKEY_JOURNAL, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
            return self.refuse_writes(
                dir,
                REKEY_JOURNAL,
                "a rekey of the volume is under way on another device",
            );
        }
        let mut seen = watch.lock();
        let version = match rustix::fs::statat(dir, CONFIG_FILE, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => FileVersion::of(&st),
            Err(e) => {
                let e = std::io::Error::from(e);
                return note_unreadable(&mut seen, dir, &e.to_string());
            }
        };
        if seen.version == Some(version) {
            return;
        }
        let (version, read) = match read_config(dir) {
            Ok(read) => read,
            Err(e) => return note_unreadable(&mut seen, dir, &e.to_string()),
        };
        match judge(&seen.config, self.volume.master_key(), &read) {
            Verdict::Same => seen.unreadable = false,
            Verdict::SlotsChanged => {
                seen.unreadable = false;
                tracing::info!(
                    "{}/{CONFIG_FILE}: its key slots changed (passwd, slots add or remove); \
                     nothing changes for this mount",
                    sys::describe(dir)
                );
                if let Ok(config) = read {
                    seen.config = config;
                }
            }
            Verdict::Unreadable(why) => note_unreadable(&mut seen, dir, &why),
            Verdict::Stop(why) => {
                drop(seen);
                return self.refuse_writes(dir, CONFIG_FILE, &why);
            }
        }
        // A version that is not a config is not read again until it changes.
        seen.version = Some(version);
    }

    /// Refuses every change from now on, saying once why (`why`, about file `name` of the
    /// cipher directory `dir`).
    fn refuse_writes(&self, dir: BorrowedFd<'_>, name: &str, why: &str) {
        let line = format!(
            "{}/{name}: {why}: writes are refused from now on (read-only file system), reads go \
             on; remount to write again",
            sys::describe(dir)
        );
        if self.config_watch.refused.set(line.clone()).is_ok() {
            tracing::error!("{line}");
        }
    }
}

/// Reports (once per episode) a config that cannot be read or parsed now; it is read again at
/// the next look.
fn note_unreadable(seen: &mut Seen, dir: BorrowedFd<'_>, why: &str) {
    seen.version = None;
    if !seen.unreadable {
        seen.unreadable = true;
        tracing::warn!(
            "{}/{CONFIG_FILE}: not a config now ({why}; half synced?): not acted on, read \
             again when it changes",
            sys::describe(dir)
        );
    }
}

/// Reads and parses the config in cipher directory `dir`: the version of the file read, and
/// the parse's result. An error when the file cannot be read.
fn read_config(
    dir: BorrowedFd<'_>,
) -> std::io::Result<(FileVersion, cloakfs_core::Result<VolumeConfig>)> {
    let fd = sys::open_internal(dir, CONFIG_FILE)?;
    let version = FileVersion::of(&rustix::fs::fstat(&fd)?);
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(CONFIG_MAX_BYTES + 1)
        .read_to_end(&mut bytes)?;
    let parsed = if bytes.len() as u64 > CONFIG_MAX_BYTES {
        Err(cloakfs_core::Error::ConfigDamaged(
            "config file too large".into(),
        ))
    } else {
        match String::from_utf8(bytes) {
            Ok(text) => VolumeConfig::parse(&text),
            Err(_) => Err(cloakfs_core::Error::ConfigDamaged("not UTF-8 text".into())),
        }
    };
    Ok((version, parsed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloakfs_core::crypto::kdf::Argon2Params;
    use cloakfs_core::crypto::secret::Passphrase;
    use cloakfs_core::format::config::{SlotRandomness, VolumeParams};

    /// A sealed config of a new volume with one passphrase slot, and its master key.
    fn volume() -> (VolumeConfig, MasterKey) {
        let mk = MasterKey::generate();
        let mut c = VolumeConfig::new(VolumeParams::new());
        c.add_passphrase_slot(
            &mk,
            &pass("one"),
            Argon2Params::LEAST,
            "",
            SlotRandomness::fresh(),
        )
        .unwrap();
        c.seal(&mk);
        (c, mk)
    }

    fn pass(p: &str) -> Passphrase {
        Passphrase::new(p.as_bytes().to_vec())
    }

    fn parsed(c: &VolumeConfig) -> cloakfs_core::Result<VolumeConfig> {
        VolumeConfig::parse(&c.to_json())
    }

    fn stops(v: Verdict, needle: &str) {
        match v {
            Verdict::Stop(why) => assert!(why.contains(needle), "{why}"),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn the_same_config_and_new_slots_change_nothing() {
        let (c, mk) = volume();
        assert_eq!(judge(&c, &mk, &parsed(&c)), Verdict::Same);
        let mut more = c.clone();
        more.add_passphrase_slot(
            &mk,
            &pass("two"),
            Argon2Params::LEAST,
            "",
            SlotRandomness::fresh(),
        )
        .unwrap();
        more.remove_slot(1).unwrap();
        more.seal(&mk);
        assert_eq!(judge(&c, &mk, &parsed(&more)), Verdict::SlotsChanged);
    }

    #[test]
    fn another_key_another_volume_and_other_fields_stop_writes() {
        let (c, mk) = volume();
        // A rekey: same volume, another master key.
        let mut rekeyed = VolumeConfig::new(c.params.clone());
        let new_key = MasterKey::generate();
        rekeyed
            .add_passphrase_slot(
                &new_key,
                &pass("one"),
                Argon2Params::LEAST,
                "",
                SlotRandomness::fresh(),
            )
            .unwrap();
        rekeyed.seal(&new_key);
        stops(
            judge(&c, &mk, &parsed(&rekeyed)),
            "rekeyed on another device",
        );
        // Slots changed without the key (tampering) read the same.
        let mut forged = c.clone();
        forged.remove_slot(1).unwrap();
        forged.seal(&new_key);
        stops(
            judge(&c, &mk, &parsed(&forged)),
            "rekeyed on another device",
        );
        let (other, _) = volume();
        stops(judge(&c, &mk, &parsed(&other)), "another volume");
        let mut upgraded = c.clone();
        upgraded.params.strict_holes = true;
        upgraded.seal(&mk);
        stops(judge(&c, &mk, &parsed(&upgraded)), ": holes");
        let newer = c
            .to_json()
            .replace("\"format_version\": \"1\"", "\"format_version\": \"2\"");
        stops(
            judge(&c, &mk, &VolumeConfig::parse(&newer)),
            "volume format version 2",
        );
    }

    #[test]
    fn a_partial_config_is_not_acted_on() {
        let (c, mk) = volume();
        let json = c.to_json();
        for cut in [0, 1, json.len() / 2, json.len() - 3] {
            let v = judge(&c, &mk, &VolumeConfig::parse(&json[..cut]));
            assert!(matches!(v, Verdict::Unreadable(_)), "{cut}: {v:?}");
        }
    }
}
