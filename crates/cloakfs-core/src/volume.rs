//! An unlocked volume: its config and the codecs derived from the master key.

use crate::crypto::kdf::Argon2Params;
use crate::crypto::keys::{label, MasterKey};
use crate::crypto::secret::Passphrase;
use crate::error::{Error, Result};
use crate::format::config::{FileKeys, SlotRandomness, VolumeConfig, VolumeParams, CONFIG_FILE};
use crate::format::content::ContentCodec;
use crate::format::dir_ids::DirIdKey;
use crate::format::filekey::{HeaderMacKey, Member};
use crate::format::meta::MetaCodec;
use crate::format::names::{DirId, NameCodec};
use crate::io::plain_list::{ManifestKey, PlainList};
use std::path::Path;
use std::sync::Arc;

/// The header key of sharing volume `config` under master key `mk` (FORMAT.md section 18.2).
pub fn header_mac_key(config: &VolumeConfig, mk: &MasterKey) -> HeaderMacKey {
    let p = &config.params;
    HeaderMacKey::new(
        mk.subkey(&p.volume_id, label::SHARE_HEADER),
        p.shared_header_mac,
    )
}

/// The key of adopted tree `p`'s manifest under master key `mk` (FORMAT.md section 21.1).
pub fn manifest_key(p: &VolumeParams, mk: &MasterKey) -> ManifestKey {
    ManifestKey::new(mk.subkey(&p.volume_id, label::ADOPTED))
}

/// The codecs of an unlocked volume. Dropping it wipes every key.
#[derive(Debug)]
pub struct Volume {
    config: VolumeConfig,
    content: Arc<ContentCodec>,
    names: NameCodec,
    meta: MetaCodec,
    dir_ids: DirIdKey,
    master_key: MasterKey,
    unlocked_slot: Option<(u32, crate::slots::Kek)>,
    /// An adopted tree's plaintext entries, once [`Self::keep_plaintext_list`] loaded them.
    plain_list: std::sync::OnceLock<PlainList>,
}

impl Volume {
    /// Derives the codecs from a master key after verifying the config MAC with it.
    pub fn from_master_key(config: VolumeConfig, mk: &MasterKey) -> Result<Self> {
        config.verify(mk)?;
        let p = &config.params;
        let id = &p.volume_id;
        let content = Arc::new(match p.file_keys {
            FileKeys::Derived => ContentCodec::new(
                p.content,
                p.block_size,
                p.strict_holes,
                mk.subkey(id, label::CONTENT),
            ),
            FileKeys::Wrapped => ContentCodec::new_wrapped(
                p.content,
                p.block_size,
                p.strict_holes,
                None,
                header_mac_key(&config, mk),
            ),
        });
        let names = NameCodec::new(mk.subkey(id, label::NAMES), p.long_name_max);
        let meta = MetaCodec::new(
            mk.subkey(id, label::METADATA),
            mk.subkey(id, label::XATTR_NAMES),
        );
        let dir_ids = DirIdKey::new(mk, id);
        Ok(Self {
            config,
            content,
            names,
            meta,
            dir_ids,
            master_key: mk.clone(),
            unlocked_slot: None,
            plain_list: std::sync::OnceLock::new(),
        })
    }

    /// Creates a volume in the empty directory `cipherdir` with one passphrase slot.
    pub fn create(
        cipherdir: &Path,
        params: VolumeParams,
        pass: &Passphrase,
        kdf: Argon2Params,
    ) -> Result<Self> {
        if params.adopted {
            check_adoptable(cipherdir)?;
        } else {
            check_empty_dir(cipherdir)?;
        }
        let mk = MasterKey::generate();
        let mut config = VolumeConfig::new(params);
        config.add_passphrase_slot(&mk, pass, kdf, "", SlotRandomness::fresh())?;
        config.seal(&mk);
        Self::save_new(cipherdir, config, &mk)
    }

    /// Saves new volume `config` in `cipherdir`; an adopted tree's manifest of plaintext
    /// entries first, so that the volume never exists without it.
    fn save_new(cipherdir: &Path, config: VolumeConfig, mk: &MasterKey) -> Result<Self> {
        let p = &config.params;
        if p.listed {
            let key = manifest_key(p, mk);
            let tags = crate::io::plain_list::tags_of_tree(
                cipherdir,
                &key,
                DirId(p.volume_id),
                &|_, _| true,
            )?;
            crate::io::plain_list::write_manifest(cipherdir, &key, &tags)?;
        }
        config.save(cipherdir)?;
        Self::from_master_key(config, mk)
    }

    /// Creates a volume with no stored key (Cryptfs/CFS style): the master key is
    /// Argon2id(passphrase, random salt). No slot can be added and the passphrase cannot be
    /// changed without re-encrypting everything; a weak passphrase is the whole key.
    pub fn create_no_stored_key(
        cipherdir: &Path,
        params: VolumeParams,
        pass: &Passphrase,
        kdf: Argon2Params,
    ) -> Result<Self> {
        kdf.validate()?;
        if params.adopted {
            check_adoptable(cipherdir)?;
        } else {
            check_empty_dir(cipherdir)?;
        }
        let (config, mk) =
            VolumeConfig::new_no_stored_key(params, pass, kdf, crate::crypto::random::array())?;
        Self::save_new(cipherdir, config, &mk)
    }

    /// Creates a volume whose config is the new file `config_file` (refused if it exists),
    /// with one passphrase slot or, with `no_stored_key`, no stored key. For a reverse view,
    /// whose plaintext directory is not empty.
    pub fn create_config_file(
        config_file: &Path,
        params: VolumeParams,
        pass: &Passphrase,
        kdf: Argon2Params,
        no_stored_key: bool,
    ) -> Result<Self> {
        kdf.validate()?;
        if config_file.symlink_metadata().is_ok() {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} already exists", config_file.display()),
            )));
        }
        let (config, mk) = if no_stored_key {
            VolumeConfig::new_no_stored_key(params, pass, kdf, crate::crypto::random::array())?
        } else {
            let mk = MasterKey::generate();
            let mut config = VolumeConfig::new(params);
            config.add_passphrase_slot(&mk, pass, kdf, "", SlotRandomness::fresh())?;
            config.seal(&mk);
            (config, mk)
        };
        config.save(config_file)?;
        Self::from_master_key(config, &mk)
    }

    /// Unlocks the volume at `cipherdir` with a passphrase.
    pub fn unlock(cipherdir: &Path, pass: &Passphrase) -> Result<Self> {
        let config = VolumeConfig::load(cipherdir)?;
        let u = config.unlock_passphrase_full(pass)?;
        let v = Self::from_master_key(config, &u.master_key)?;
        Ok(match u.kek {
            Some(kek) => v.with_unlocked_slot(u.slot_id, kek),
            None => v,
        })
    }

    /// Whether this is a sharing volume (each file's key wrapped to its recipients).
    pub fn is_sharing(&self) -> bool {
        self.config.params.file_keys == FileKeys::Wrapped
    }

    /// Opens the files of a sharing volume as `member` (whose identities unwrap file keys,
    /// and to whom new files are granted). Refused on a volume that is not sharing.
    pub fn join_as(mut self, member: Member) -> Result<Self> {
        if !self.is_sharing() {
            return Err(Error::Refused(
                "this volume is not a sharing volume (made without --sharing)".into(),
            ));
        }
        let p = &self.config.params;
        self.content = Arc::new(ContentCodec::new_wrapped(
            p.content,
            p.block_size,
            p.strict_holes,
            Some(member),
            header_mac_key(&self.config, &self.master_key),
        ));
        Ok(self)
    }

    /// Has a sharing volume check file IDs against its retirement records in `cipherdir` and
    /// this user's record on this machine (FORMAT.md section 18.8); `share remove` adds to
    /// both. Nothing on other volumes.
    pub fn keep_retired_ids(&self, cipherdir: &Path) {
        let crate::format::filekey::FileKeySource::Wrapped(w) = self.content.key_source() else {
            return;
        };
        let id = &self.config.params.volume_id;
        let local = crate::known_volumes::state_dir()
            .ok()
            .map(|d| d.join("retired").join(crate::text::b64(id)));
        w.keep_retired_in(Arc::new(crate::io::retired::RetiredIds::open(
            cipherdir,
            self.master_key.subkey(id, label::SHARE_RETIRED),
            local,
        )));
    }

    /// Has an adopted tree serve only the plaintext entries its manifest in `cipherdir` lists
    /// (FORMAT.md section 21.1), retired ones also known from this user's record on this
    /// machine. Nothing on other volumes, and nothing after the first call.
    pub fn keep_plaintext_list(&self, cipherdir: &Path) {
        let p = &self.config.params;
        if !p.listed {
            return;
        }
        self.plain_list.get_or_init(|| {
            let local = crate::known_volumes::state_dir().ok().map(|d| {
                d.join("adopted-retired")
                    .join(crate::text::b64(&p.volume_id))
            });
            PlainList::load(cipherdir, manifest_key(p, &self.master_key), local)
        });
    }

    /// Whether plaintext entry `name` of the directory with ID `dir` (None: a directory
    /// without one) may be served: on an adopted tree with a manifest, only an entry it lists
    /// and that was not retired (and none before [`Self::keep_plaintext_list`]); on one
    /// adopted before manifests, every one.
    pub fn plaintext_listed(&self, dir: Option<&DirId>, name: &[u8]) -> bool {
        if !self.config.params.listed {
            return true;
        }
        match (dir, self.plain_list.get()) {
            (Some(dir), Some(list)) => list.is_listed(dir, name),
            _ => false,
        }
    }

    /// Retires listed plaintext entry `name` of `dir` (it was encrypted or removed): that
    /// name is not served as plaintext there again.
    pub fn retire_plaintext(&self, dir: &DirId, name: &[u8]) -> Result<()> {
        match self.plain_list.get() {
            Some(list) => list.retire(dir, name),
            None => Ok(()),
        }
    }

    /// Why an adopted tree serves no plaintext entry at all: its manifest is missing or does
    /// not authenticate.
    pub fn plaintext_list_problem(&self) -> Option<String> {
        if !self.config.params.listed {
            return None;
        }
        match self.plain_list.get() {
            Some(list) => list.problem().map(str::to_string),
            None => Some("not loaded".into()),
        }
    }

    /// Records which slot opened the volume and that slot's KEK, so `rekey` can re-wrap the
    /// slot around a new master key. Every unlock path through a slot should call this.
    pub fn with_unlocked_slot(mut self, slot_id: u32, kek: crate::slots::Kek) -> Self {
        self.unlocked_slot = Some((slot_id, kek));
        self
    }

    /// The slot that opened the volume and its KEK, if recorded.
    pub fn unlocked_slot(&self) -> Option<(u32, &crate::slots::Kek)> {
        self.unlocked_slot.as_ref().map(|(id, k)| (*id, k))
    }

    /// The master key (for rekey and slot changes; never to be logged or stored unwrapped).
    pub fn master_key(&self) -> &MasterKey {
        &self.master_key
    }

    /// The verified config.
    pub fn config(&self) -> &VolumeConfig {
        &self.config
    }

    /// Content encryption, shared with every open file.
    pub fn content(&self) -> &Arc<ContentCodec> {
        &self.content
    }

    /// Name encryption.
    pub fn names(&self) -> &NameCodec {
        &self.names
    }

    /// Symlink target and xattr encryption.
    pub fn meta(&self) -> &MetaCodec {
        &self.meta
    }

    /// The ID of a new directory named `name` (plaintext) in the directory with ID `parent`:
    /// derived, so every device that makes the same path writes the same ID (FORMAT.md 9.2).
    ///
    /// `CLOAKFS_TEST_RANDOM_DIR_IDS=1` makes them random, as volumes made before derived IDs
    /// have them: the sync-folder tests make directory conflicts with it.
    pub fn new_dir_id(&self, parent: &DirId, name: &[u8]) -> DirId {
        static RANDOM: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *RANDOM.get_or_init(|| {
            std::env::var_os("CLOAKFS_TEST_RANDOM_DIR_IDS").is_some_and(|v| v == "1")
        }) {
            return DirId::random();
        }
        self.dir_ids.derive(parent, name)
    }

    /// The ID derived for a directory named `name` (plaintext) in the directory with ID
    /// `parent` (FORMAT.md 9.2), whatever [`Volume::new_dir_id`] gives: what `fsck --repair`
    /// writes, so two devices that repair agree.
    pub fn derived_dir_id(&self, parent: &DirId, name: &[u8]) -> DirId {
        self.dir_ids.derive(parent, name)
    }

    /// The root directory's ID (the volume ID; the root has no `cloakfs.dirid` file).
    pub fn root_dir_id(&self) -> DirId {
        DirId(self.config.params.volume_id)
    }
}

/// Refuses what `init --adopt` cannot adopt: a missing directory, an existing volume, and a
/// tree holding a name cloakfs reserves (`cloakfs.` prefix), which the mount would hide.
pub fn check_adoptable(dir: &Path) -> Result<()> {
    let refuse = |kind, msg: String| Err(Error::Io(std::io::Error::new(kind, msg)));
    if dir.join(CONFIG_FILE).exists() {
        return refuse(
            std::io::ErrorKind::AlreadyExists,
            format!("{} already holds a cloakfs volume", dir.display()),
        );
    }
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return refuse(
                std::io::ErrorKind::NotADirectory,
                format!("{} is not a directory", dir.display()),
            )
        }
        Err(e) => {
            return refuse(e.kind(), format!("{}: {e}", dir.display()));
        }
    }
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let name = entry.file_name();
            // What an interrupted `init --adopt` leaves (no config was written): written again.
            let left_by_init = name == crate::format::names::DIRID_FILE
                || d == dir
                    && name
                        .to_str()
                        .is_some_and(crate::io::plain_list::is_manifest_file);
            if !left_by_init && !crate::format::names::is_adoptable(name.as_encoded_bytes()) {
                return refuse(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "{} has a name cloakfs reserves (cloakfs.*); rename it before adopting",
                        entry.path().display()
                    ),
                );
            }
            if entry.file_type()?.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    Ok(())
}

/// Refuses an existing volume and a non-empty directory; creates a missing directory.
fn check_empty_dir(dir: &Path) -> Result<()> {
    if dir.join(CONFIG_FILE).exists() {
        return Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} already holds a cloakfs volume", dir.display()),
        )));
    }
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::DirectoryNotEmpty,
                    format!("{} is not empty", dir.display()),
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}
