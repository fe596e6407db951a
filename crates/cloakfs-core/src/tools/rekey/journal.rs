//! The rekey journal (`cloakfs.rekey`): the new master key wrapped under a subkey of the old
//! one, and the complete new config, written before any entry changes and removed last.

use super::engine::{rename_noreplace, sync_dir, temp_name};
use super::journal_path;
use crate::crypto::keys::MasterKey;
use crate::crypto::secret::SecretBytes;
use crate::error::{Error, Result};
use crate::format::config::{VolumeConfig, CONFIG_MAX_BYTES};
use crate::text::{b64, unb64};
use crate::tools::walk::REKEY_JOURNAL;
use crate::volume::Volume;
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::Aes256Gcm;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Version of the journal layout.
pub const JOURNAL_VERSION: u64 = 1;
/// HKDF label (of the old master key) of the key that wraps the new master key in the journal.
pub const LABEL_JOURNAL: &str = "rekey-journal";
/// First line of the journal's key-wrap AAD.
pub const JOURNAL_DOMAIN: &str = "cloakfs rekey v1\n";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct JournalFile {
    pub(super) cloakfs_rekey: u64,
    pub(super) volume_id: String,
    pub(super) new_key: String,
    pub(super) new_config: String,
}

pub(super) fn journal_aad(volume_id: &[u8; 16], new_config: &str) -> Vec<u8> {
    format!(
        "{JOURNAL_DOMAIN}volume_id={}\nnew_config_sha256={}\n",
        b64(volume_id),
        b64(&Sha256::digest(new_config.as_bytes()))
    )
    .into_bytes()
}

pub(super) fn journal_cipher(old: &MasterKey, volume_id: &[u8; 16]) -> Aes256Gcm {
    let k: SecretBytes<32> = old.subkey(volume_id, LABEL_JOURNAL);
    Aes256Gcm::new(k.expose().into())
}

pub(super) fn write_journal(
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
pub(super) struct Journal {
    pub(super) new_key: MasterKey,
    pub(super) new_config: VolumeConfig,
}

pub(super) enum JournalState {
    /// The config on disk is still the old one: the journal opens with its key.
    Open(Journal),
    /// The config on disk is already the journal's new config.
    Swapped,
}

/// Largest rekey journal read, so a planted one cannot exhaust memory: it holds a config (at
/// most `CONFIG_MAX_BYTES`) as a JSON string, which escaping makes at most 6 times longer
/// (`\u0001`), and short fields.
pub(super) const JOURNAL_MAX_BYTES: u64 = 6 * CONFIG_MAX_BYTES + 4096;

pub(super) fn read_journal(cipherdir: &Path, volume: &Volume) -> Result<JournalState> {
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

pub(super) fn remove_journal(cipherdir: &Path) -> Result<()> {
    let path = journal_path(cipherdir);
    std::fs::remove_file(&path)?;
    sync_dir(path.parent().expect("journal has a directory"))?;
    Ok(())
}
