//! The volume config (`cloakfs.conf`): volume parameters, key slots, and a MAC over both.
//!
//! On disk it is JSON whose leaves are all strings (numbers in decimal, bytes in base64url), so
//! that its canonical form is simple: see [`VolumeConfig::canonical`] and docs/FORMAT.md. The MAC
//! is HMAC-SHA256 under a subkey of the master key, so any change to a parameter, a flag or a
//! slot is detected once the volume is unlocked, whichever slot unlocked it.

use crate::crypto::kdf::{Argon2Params, SALT_LEN};
use crate::crypto::keys::{label, MasterKey};
use crate::crypto::secret::SecretBytes;
use crate::error::{Error, Result};
use crate::format::content::ContentSuite;
use crate::format::names::{LONG_NAME_MAX_DEFAULT, LONG_NAME_MAX_MIN};
use crate::text::{b64, get, parse_b64, parse_num, unb64_array, Fields};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::fs;
use std::io::Write;
use std::path::Path;

/// File name of the config inside the cipher directory.
pub const CONFIG_FILE: &str = "cloakfs.conf";
/// Version of the config file layout written by this build.
pub const CONFIG_VERSION: u64 = 1;
/// Version of the volume format (content, names, metadata) written by this build.
pub const FORMAT_VERSION: u64 = 1;
/// First line of the canonical text the config MAC covers.
pub const MAC_DOMAIN: &str = "cloakfs config v1\n";
/// Largest config file this build will read (a damaged config must not exhaust memory).
pub const CONFIG_MAX_BYTES: u64 = 1 << 20;
/// Value of the volume field `shared_header_mac`: the one MAC defined for sharing headers.
pub const SHARED_HEADER_MAC: &str = "hmac-sha256";

pub use crate::slots::{kind, KeySlot, SlotRandomness};

mod key_slots;

/// Parameters that fix how the volume's bytes are laid out and encrypted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeParams {
    /// Random volume ID: HKDF salt, and the root directory's ID.
    pub volume_id: [u8; 16],
    /// Content AEAD.
    pub content: ContentSuite,
    /// Plaintext bytes per content block.
    pub block_size: u64,
    /// Longest encrypted name stored as is; longer ones spill to long-name files.
    pub long_name_max: usize,
    /// Whether an all-zero block is tampering (strict) rather than a hole.
    pub strict_holes: bool,
    /// An adopted plaintext tree (`init --adopt`): backing entries whose names do not decrypt
    /// are plaintext entries, served as they are. Stored as `plaintext_entries = "listed"`
    /// (with `listed`) or, made by an older cloakfs, `"adopted"`; never on a normal volume, so
    /// that it never treats a stray file as plaintext.
    pub adopted: bool,
    /// An adopted tree whose plaintext entries are the ones its manifest lists
    /// (`cloakfs.adopted`, FORMAT.md section 21.1): no other backing entry is served as
    /// plaintext. Only with `adopted`; set at `init --adopt`, and by `cloakfs upgrade` on
    /// trees adopted before manifests.
    pub listed: bool,
    /// An adopted tree whose conversion finished (`cloakfs encrypt -r` of the whole volume
    /// left no plaintext entry; never with `adopted`): from then on no backing entry is
    /// plaintext, as in a volume that never was adopted. Stored as
    /// `plaintext_entries = "converted"`.
    pub converted: bool,
    /// Where each file's content key comes from (volume field `file_keys`).
    pub file_keys: FileKeys,
    /// A sharing volume whose every file header carries a MAC under the volume's header key
    /// (`shared_header_mac = "hmac-sha256"`, FORMAT.md section 18.2): a header made without
    /// the volume key is refused. Set on every sharing volume made now, and by `cloakfs
    /// upgrade` on older ones.
    pub shared_header_mac: bool,
}

/// Where each file's content key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FileKeys {
    /// Derived from the volume's content key and the file ID (field absent).
    #[default]
    Derived,
    /// Random per file, wrapped with age to each of the file's recipients in its header
    /// (`file_keys = "age"`: a sharing volume, FORMAT.md section 18).
    Wrapped,
}

impl VolumeParams {
    /// Defaults with a fresh random volume ID.
    pub fn new() -> Self {
        Self {
            volume_id: crate::crypto::random::array(),
            content: ContentSuite::Aes256Gcm,
            block_size: 4096,
            long_name_max: LONG_NAME_MAX_DEFAULT,
            strict_holes: false,
            file_keys: FileKeys::Derived,
            shared_header_mac: false,
            adopted: false,
            listed: false,
            converted: false,
        }
    }

    /// Makes these the parameters of a sharing volume as made now: file keys wrapped to
    /// recipients, every file header authenticated under the volume key.
    pub fn make_sharing(&mut self) {
        self.file_keys = FileKeys::Wrapped;
        self.shared_header_mac = true;
    }

    fn to_fields(&self) -> Fields {
        let mut f = Fields::new();
        f.insert("format_version".into(), FORMAT_VERSION.to_string());
        f.insert("volume_id".into(), b64(&self.volume_id));
        f.insert("content_cipher".into(), self.content.name().into());
        f.insert("name_cipher".into(), "aes-256-siv".into());
        f.insert("block_size".into(), self.block_size.to_string());
        f.insert("long_name_max".into(), self.long_name_max.to_string());
        let holes = if self.strict_holes {
            "strict"
        } else {
            "sparse"
        };
        f.insert("holes".into(), holes.into());
        if self.file_keys == FileKeys::Wrapped {
            f.insert("file_keys".into(), "age".into());
        }
        if self.shared_header_mac {
            f.insert("shared_header_mac".into(), SHARED_HEADER_MAC.into());
        }
        if self.adopted {
            let mode = if self.listed { "listed" } else { "adopted" };
            f.insert("plaintext_entries".into(), mode.into());
        } else if self.converted {
            f.insert("plaintext_entries".into(), "converted".into());
        }
        f
    }

    fn from_fields(f: &Fields) -> Result<Self> {
        const KNOWN: [&str; 10] = [
            "file_keys",
            "shared_header_mac",
            "format_version",
            "volume_id",
            "content_cipher",
            "name_cipher",
            "block_size",
            "long_name_max",
            "holes",
            "plaintext_entries",
        ];
        if let Some(k) = f.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(Error::ConfigDamaged(format!(
                "unknown volume field {k:?} (made by a newer cloakfs?)"
            )));
        }
        let version: u64 = parse_num(f, "format_version")?;
        if version != FORMAT_VERSION {
            return Err(Error::UnsupportedVersion {
                what: "volume format",
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let content = ContentSuite::from_name(get(f, "content_cipher")?).ok_or_else(|| {
            Error::ConfigDamaged(format!(
                "unknown content cipher {:?}",
                get(f, "content_cipher").unwrap_or_default()
            ))
        })?;
        if get(f, "name_cipher")? != "aes-256-siv" {
            return Err(Error::ConfigDamaged("unknown name cipher".into()));
        }
        let block_size: u64 = parse_num(f, "block_size")?;
        if !block_size.is_power_of_two() || !(512..=1 << 20).contains(&block_size) {
            return Err(Error::ConfigDamaged(format!(
                "block size {block_size} not supported"
            )));
        }
        let long_name_max: usize = parse_num(f, "long_name_max")?;
        if !(LONG_NAME_MAX_MIN..=LONG_NAME_MAX_DEFAULT).contains(&long_name_max) {
            return Err(Error::ConfigDamaged(format!(
                "long_name_max {long_name_max} out of range"
            )));
        }
        let strict_holes = match get(f, "holes")? {
            "strict" if !content.authenticated() => {
                return Err(Error::ConfigDamaged(format!(
                    "strict holes with {} (which cannot detect tampering)",
                    content.name()
                )))
            }
            "sparse" => false,
            "strict" => true,
            other => {
                return Err(Error::ConfigDamaged(format!(
                    "unknown holes mode {other:?}"
                )))
            }
        };
        let file_keys = match f.get("file_keys").map(String::as_str) {
            None => FileKeys::Derived,
            Some("age") if !content.authenticated() => {
                return Err(Error::ConfigDamaged(format!(
                    "file_keys \"age\" with {} (a sharing volume needs an authenticated cipher)",
                    content.name()
                )))
            }
            Some("age") => FileKeys::Wrapped,
            Some(other) => {
                return Err(Error::ConfigDamaged(format!(
                    "unknown file_keys {other:?} (made by a newer cloakfs?)"
                )))
            }
        };
        let shared_header_mac = match f.get("shared_header_mac").map(String::as_str) {
            None => false,
            Some(SHARED_HEADER_MAC) if file_keys == FileKeys::Wrapped => true,
            Some(SHARED_HEADER_MAC) => {
                return Err(Error::ConfigDamaged(
                    "shared_header_mac on a volume that is not a sharing volume".into(),
                ))
            }
            Some(other) => {
                return Err(Error::ConfigDamaged(format!(
                    "unknown shared_header_mac {other:?} (made by a newer cloakfs?)"
                )))
            }
        };
        let (adopted, listed, converted) = match f.get("plaintext_entries").map(String::as_str) {
            None => (false, false, false),
            Some("listed") => (true, true, false),
            Some("adopted") => (true, false, false),
            Some("converted") => (false, false, true),
            Some(other) => {
                return Err(Error::ConfigDamaged(format!(
                    "unknown plaintext_entries mode {other:?}"
                )))
            }
        };
        Ok(Self {
            adopted,
            listed,
            converted,
            volume_id: parse_b64(f, "volume_id")?,
            content,
            block_size,
            long_name_max,
            strict_holes,
            file_keys,
            shared_header_mac,
        })
    }
}

impl Default for VolumeParams {
    fn default() -> Self {
        Self::new()
    }
}

/// The parsed volume config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeConfig {
    /// Volume parameters.
    pub params: VolumeParams,
    pub(crate) key_source: KeySource,
    pub(crate) slots: Vec<KeySlot>,
    pub(crate) mac: Option<[u8; 32]>,
}

/// Where the master key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A random master key, stored only wrapped by key slots (the default; no volume field).
    Slots,
    /// No stored key (volume field `key_source = passphrase`, Cryptfs/CFS style): the master
    /// key is Argon2id(passphrase, salt) with the parameters stored in the volume section.
    Passphrase {
        /// Argon2id cost.
        kdf: Argon2Params,
        /// Argon2id salt.
        salt: [u8; SALT_LEN],
    },
}

/// Volume fields that describe a [`KeySource::Passphrase`] volume.
const KEY_SOURCE_FIELDS: [&str; 6] = [
    "key_source",
    "kdf",
    "argon2_memory_kib",
    "argon2_iterations",
    "argon2_lanes",
    "salt",
];

impl KeySource {
    fn to_fields(&self, f: &mut Fields) {
        if let KeySource::Passphrase { kdf, salt } = self {
            f.insert("key_source".into(), "passphrase".into());
            f.extend(crate::slots::passphrase::fields(kdf, salt));
        }
    }

    /// Takes the key-source fields out of the volume section.
    fn take_from(f: &mut Fields) -> Result<Self> {
        let mut own = Fields::new();
        for k in KEY_SOURCE_FIELDS {
            if let Some(v) = f.remove(k) {
                own.insert(k.into(), v);
            }
        }
        if own.is_empty() {
            return Ok(KeySource::Slots);
        }
        match get(&own, "key_source")? {
            "passphrase" => Ok(KeySource::Passphrase {
                kdf: crate::slots::passphrase::params(&own)?,
                salt: parse_b64(&own, "salt")?,
            }),
            other => Err(Error::ConfigDamaged(format!(
                "unknown key_source {other:?} (made by a newer cloakfs?)"
            ))),
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    cloakfs: u64,
    volume: Fields,
    slots: Vec<Fields>,
    mac: String,
}

impl VolumeConfig {
    /// A config with no slots yet (the master key will be stored wrapped by slots).
    pub fn new(params: VolumeParams) -> Self {
        Self {
            params,
            key_source: KeySource::Slots,
            slots: Vec::new(),
            mac: None,
        }
    }

    /// A config of a volume with no stored key: the master key is Argon2id(passphrase) with
    /// these parameters. Returns the config (sealed) and the master key.
    pub fn new_no_stored_key(
        params: VolumeParams,
        pass: &crate::crypto::secret::Passphrase,
        kdf: Argon2Params,
        salt: [u8; SALT_LEN],
    ) -> Result<(Self, MasterKey)> {
        let mk = MasterKey::from_bytes(crate::crypto::kdf::derive(pass, &salt, &kdf)?.expose());
        let mut c = Self {
            params,
            key_source: KeySource::Passphrase { kdf, salt },
            slots: Vec::new(),
            mac: None,
        };
        c.seal(&mk);
        Ok((c, mk))
    }

    /// Where the master key comes from.
    pub fn key_source(&self) -> &KeySource {
        &self.key_source
    }

    /// Whether the master key is stored (wrapped by slots), as opposed to derived from the
    /// passphrase alone.
    pub fn has_stored_key(&self) -> bool {
        self.key_source == KeySource::Slots
    }

    /// The volume section as stored: parameters and key source.
    pub fn volume_fields(&self) -> Fields {
        let mut f = self.params.to_fields();
        self.key_source.to_fields(&mut f);
        f
    }

    /// The text the MAC covers: `MAC_DOMAIN`, then `volume.K=V` lines sorted by K, then for the
    /// i-th slot `slot.i.K=V` lines sorted by K.
    pub fn canonical(&self) -> String {
        let mut s = String::from(MAC_DOMAIN);
        for (k, v) in self.volume_fields() {
            s.push_str(&format!("volume.{k}={v}\n"));
        }
        for (i, slot) in self.slots.iter().enumerate() {
            for (k, v) in &slot.fields {
                s.push_str(&format!("slot.{i}.{k}={v}\n"));
            }
        }
        s
    }

    fn compute_mac(&self, mk: &MasterKey) -> [u8; 32] {
        let key: SecretBytes<32> = mk.subkey(&self.params.volume_id, label::CONFIG_MAC);
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key.expose()).expect("any key length");
        m.update(self.canonical().as_bytes());
        m.finalize().into_bytes().into()
    }

    /// Computes and stores the MAC (after any change).
    pub fn seal(&mut self, mk: &MasterKey) {
        self.mac = Some(self.compute_mac(mk));
    }

    /// Verifies the MAC in constant time.
    pub fn verify(&self, mk: &MasterKey) -> Result<()> {
        let key: SecretBytes<32> = mk.subkey(&self.params.volume_id, label::CONFIG_MAC);
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key.expose()).expect("any key length");
        m.update(self.canonical().as_bytes());
        match &self.mac {
            Some(mac) if m.verify_slice(mac).is_ok() => Ok(()),
            _ => Err(Error::ConfigTampered),
        }
    }

    /// Serializes to the on-disk JSON. Panics if the config was changed and not sealed.
    pub fn to_json(&self) -> String {
        let file = ConfigFile {
            cloakfs: CONFIG_VERSION,
            volume: self.volume_fields(),
            slots: self.slots.iter().map(|s| s.fields.clone()).collect(),
            mac: b64(&self
                .mac
                .expect("config must be sealed before it is written")),
        };
        let mut s = serde_json::to_string_pretty(&file).expect("string maps serialize");
        s.push('\n');
        s
    }

    /// Parses the on-disk JSON, checking versions and field syntax (not the MAC: that needs
    /// the key).
    pub fn parse(text: &str) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::ConfigDamaged(format!("not valid JSON ({e})")))?;
        match value.get("cloakfs").and_then(serde_json::Value::as_u64) {
            Some(CONFIG_VERSION) => {}
            Some(v) => {
                return Err(Error::UnsupportedVersion {
                    what: "config",
                    found: v,
                    supported: CONFIG_VERSION,
                })
            }
            None => return Err(Error::ConfigDamaged("missing \"cloakfs\" version".into())),
        }
        let file: ConfigFile =
            serde_json::from_value(value).map_err(|e| Error::ConfigDamaged(e.to_string()))?;
        for f in std::iter::once(&file.volume).chain(file.slots.iter()) {
            check_fields(f)?;
        }
        let mut volume = file.volume;
        let key_source = KeySource::take_from(&mut volume)?;
        let params = VolumeParams::from_fields(&volume)?;
        let mut slots = Vec::new();
        for f in file.slots {
            let slot = KeySlot { fields: f };
            let _: u32 = parse_num(&slot.fields, "id")?;
            get(&slot.fields, "kind")?;
            if slots.iter().any(|s: &KeySlot| s.id() == slot.id()) {
                return Err(Error::ConfigDamaged(format!(
                    "duplicate slot id {}",
                    slot.id()
                )));
            }
            slots.push(slot);
        }
        if key_source != KeySource::Slots && !slots.is_empty() {
            return Err(Error::ConfigDamaged(
                "a volume without a stored key cannot have key slots".into(),
            ));
        }
        let mac = unb64_array(&file.mac)
            .ok_or_else(|| Error::ConfigDamaged("mac is not 32 base64url bytes".into()))?;
        Ok(Self {
            params,
            key_source,
            slots,
            mac: Some(mac),
        })
    }

    /// Reads and parses `CONFIG_FILE` from `dir` (or the file `path` itself if it is one).
    pub fn load(path: &Path) -> Result<Self> {
        let file = config_path(path);
        let f = match fs::File::open(&file) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotAVolume(path.display().to_string(), CONFIG_FILE))
            }
            Err(e) => return Err(e.into()),
        };
        let mut text = String::new();
        use std::io::Read;
        f.take(CONFIG_MAX_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|_| Error::ConfigDamaged("not UTF-8 text".into()))?;
        if text.len() as u64 > CONFIG_MAX_BYTES {
            return Err(Error::ConfigDamaged("config file too large".into()));
        }
        Self::parse(&text)
    }

    /// Writes the config atomically: temporary file, fsync, rename over, fsync directory. A
    /// crash at any point leaves either the old or the new config.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.save_observed(path, &mut |_| {})
    }

    /// [`VolumeConfig::save`], calling `observe` after each step (`"created"`, `"written"`,
    /// `"synced"`, `"renamed"`, `"dir-synced"`), so tests can capture what a crash at that
    /// moment would leave on disk.
    #[doc(hidden)]
    pub fn save_observed(&self, path: &Path, observe: &mut dyn FnMut(&str)) -> Result<()> {
        let file = config_path(path);
        let dir = file.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!(
            "{}.tmp.{}",
            file.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or(CONFIG_FILE),
            std::process::id()
        ));
        let json = self.to_json();
        let result = (|| -> Result<()> {
            // A leftover of a crashed process that had our PID: no live process can own it.
            match fs::remove_file(&tmp) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            observe("created");
            f.write_all(json.as_bytes())?;
            observe("written");
            f.sync_all()?;
            observe("synced");
            fs::rename(&tmp, &file)?;
            observe("renamed");
            fs::File::open(dir)?.sync_all()?;
            observe("dir-synced");
            Ok(())
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }
}

/// Where the config of the volume at `path` lives: `path/cloakfs.conf` for a directory.
pub fn config_path(path: &Path) -> std::path::PathBuf {
    if path.is_dir() {
        path.join(CONFIG_FILE)
    } else {
        path.to_path_buf()
    }
}

fn check_fields(f: &Fields) -> Result<()> {
    for (k, v) in f {
        let key_ok = !k.is_empty()
            && k.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !key_ok || v.contains(['\n', '\0']) {
            return Err(Error::ConfigDamaged(format!("malformed field {k:?}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::secret::Passphrase;

    /// A config of `params` with one passphrase slot ("correct horse"), sealed under `mk`.
    fn sealed(params: VolumeParams, mk: &MasterKey) -> VolumeConfig {
        let mut c = VolumeConfig::new(params);
        let pass = Passphrase::new(b"correct horse".to_vec());
        c.add_passphrase_slot(
            mk,
            &pass,
            Argon2Params::LEAST,
            "main",
            SlotRandomness::fresh(),
        )
        .unwrap();
        c.seal(mk);
        c
    }

    fn make() -> (VolumeConfig, MasterKey) {
        let mk = MasterKey::generate();
        (sealed(VolumeParams::new(), &mk), mk)
    }

    #[test]
    fn round_trip_and_unlock() {
        let (c, mk) = make();
        let parsed = VolumeConfig::parse(&c.to_json()).unwrap();
        assert_eq!(parsed, c);
        let (got, id) = parsed
            .unlock_passphrase(&Passphrase::new(b"correct horse".to_vec()))
            .unwrap();
        assert_eq!(got.expose(), mk.expose());
        assert_eq!(id, 1);
        assert!(matches!(
            parsed.unlock_passphrase(&Passphrase::new(b"wrong".to_vec())),
            Err(Error::WrongSecret)
        ));
    }

    #[test]
    fn flipped_flag_is_refused_after_unlock() {
        let (c, _) = make();
        let json = c.to_json().replace("\"sparse\"", "\"strict\"");
        let parsed = VolumeConfig::parse(&json).unwrap();
        assert!(matches!(
            parsed.unlock_passphrase(&Passphrase::new(b"correct horse".to_vec())),
            Err(Error::ConfigTampered)
        ));
    }

    #[test]
    fn a_converted_tree_round_trips_and_cannot_be_switched_back_to_adopted() {
        let mk = MasterKey::generate();
        let mut p = VolumeParams::new();
        p.converted = true;
        let c = sealed(p, &mk);
        let pass = Passphrase::new(b"correct horse".to_vec());
        let json = c.to_json();
        assert!(
            json.contains("\"plaintext_entries\": \"converted\""),
            "{json}"
        );
        let parsed = VolumeConfig::parse(&json).unwrap();
        assert_eq!(parsed, c);
        assert!(parsed.params.converted && !parsed.params.adopted);
        // Back to "adopted" without the key: the MAC refuses it.
        let back = VolumeConfig::parse(&json.replace("\"converted\"", "\"adopted\"")).unwrap();
        assert!(back.params.adopted);
        assert!(matches!(
            back.unlock_passphrase(&pass),
            Err(Error::ConfigTampered)
        ));
        // Nor can a listed tree be switched to the unlisted mode of older versions.
        let mut p = VolumeParams::new();
        (p.adopted, p.listed) = (true, true);
        let c = sealed(p, &mk);
        let listed = c.to_json();
        assert!(
            listed.contains("\"plaintext_entries\": \"listed\""),
            "{listed}"
        );
        assert_eq!(VolumeConfig::parse(&listed).unwrap(), c);
        let unlisted = VolumeConfig::parse(&listed.replace("\"listed\"", "\"adopted\"")).unwrap();
        assert!(unlisted.params.adopted && !unlisted.params.listed);
        assert!(matches!(
            unlisted.unlock_passphrase(&pass),
            Err(Error::ConfigTampered)
        ));
        // A mode this version does not know is refused.
        let other = json.replace("\"converted\"", "\"partly\"");
        assert!(matches!(
            VolumeConfig::parse(&other),
            Err(Error::ConfigDamaged(m)) if m.contains("plaintext_entries")
        ));
    }

    #[test]
    fn unauthenticated_content_with_wrapped_keys_is_refused() {
        let mut p = VolumeParams::new();
        p.content = crate::format::content::ContentSuite::Aes256Xts;
        p.file_keys = FileKeys::Wrapped;
        let mut c = VolumeConfig::new(p);
        c.seal(&MasterKey::generate());
        let json = c.to_json();
        assert!(matches!(
            VolumeConfig::parse(&json),
            Err(Error::ConfigDamaged(m)) if m.contains("authenticated cipher")
        ));
    }

    #[test]
    fn changed_kdf_parameter_is_refused() {
        let (c, _) = make();
        let json = c.to_json().replace(
            "\"argon2_iterations\": \"1\"",
            "\"argon2_iterations\": \"2\"",
        );
        let parsed = VolumeConfig::parse(&json).unwrap();
        assert!(parsed
            .unlock_passphrase(&Passphrase::new(b"correct horse".to_vec()))
            .is_err());
    }

    #[test]
    fn versions_and_damage() {
        let (c, _) = make();
        let json = c.to_json().replace("\"cloakfs\": 1", "\"cloakfs\": 2");
        assert!(matches!(
            VolumeConfig::parse(&json),
            Err(Error::UnsupportedVersion { found: 2, .. })
        ));
        let json = c
            .to_json()
            .replace("\"format_version\": \"1\"", "\"format_version\": \"9\"");
        assert!(matches!(
            VolumeConfig::parse(&json),
            Err(Error::UnsupportedVersion { found: 9, .. })
        ));
        assert!(matches!(
            VolumeConfig::parse("{garbage"),
            Err(Error::ConfigDamaged(_))
        ));
        let json = c.to_json().replace("\"holes\"", "\"holez\"");
        assert!(VolumeConfig::parse(&json).is_err());
    }
}
