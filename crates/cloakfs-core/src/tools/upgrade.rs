//! `cloakfs upgrade`: brings a volume made by an older cloakfs to the current format, offline.
//!
//! An adopted tree made before manifests (`plaintext_entries = "adopted"`) gets the manifest
//! of the plaintext entries it holds now (FORMAT.md section 21.1), then `"listed"` in its
//! config; from then on a plaintext entry put there later is not served. It lists what is
//! there when it runs: look at `cloakfs fsck`'s list of plaintext files first where the
//! storage may have been written by someone else.
//!
//! A sharing volume without `shared_header_mac` (FORMAT.md section 18.2)
//! gets the volume MAC on every file header, then the field in its config. Headers first, so
//! that a crash leaves a volume that this version reads (a header with a right volume MAC is
//! accepted whether the field is set or not) and that a second run finishes; the config last,
//! after a syncfs. From then on a header made without the volume key is refused.
//!
//! An upgrade authenticates the headers as it finds them: a header forged before it runs gets
//! a volume MAC too. Run `cloakfs fsck --identity ...` first where the storage may have been
//! written by someone else.

use crate::error::{Error, Result};
use crate::format::config::config_path;
use crate::tools::walk::{EntryType, Item, Walker};
use crate::volume::Volume;
use std::path::Path;

/// What an upgrade did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Upgraded {
    /// File headers given a volume MAC.
    pub headers: u64,
    /// Plaintext entries an adopted tree's new manifest lists (None: no manifest written).
    pub plaintext_listed: Option<u64>,
    /// Whether the config changed (false: the volume was current already).
    pub config: bool,
}

/// Upgrades the unmounted volume `volume` in `cipherdir` (see the module documentation).
pub fn upgrade(volume: &Volume, cipherdir: &Path) -> Result<Upgraded> {
    let params = &volume.config().params;
    let sharing = volume.is_sharing() && !params.shared_header_mac;
    let adopted = params.adopted && !params.listed;
    if !sharing && !adopted {
        return Ok(Upgraded::default());
    }
    crate::tools::rekey::check_not_rekeying(cipherdir)?;
    crate::tools::mounts::check_not_mounted(cipherdir)?;
    let _lock = crate::tools::rekey::lock_volume(cipherdir)?;
    let mut done = Upgraded::default();
    if sharing {
        done = authenticate_headers(volume, cipherdir)?;
    }
    if adopted {
        let current = Volume::from_master_key(
            crate::format::config::VolumeConfig::load(cipherdir)?,
            volume.master_key(),
        )?;
        done.plaintext_listed = Some(list_plaintext(&current, cipherdir)?);
        done.config = true;
    }
    Ok(done)
}

/// Writes the manifest of the plaintext entries of unlisted adopted tree `volume`, then
/// marks the tree listed; returns how many it lists.
fn list_plaintext(volume: &Volume, cipherdir: &Path) -> Result<u64> {
    let mk = volume.master_key();
    let key = crate::volume::manifest_key(&volume.config().params, mk);
    let names = volume.names();
    let tags = crate::io::plain_list::tags_of_tree(
        cipherdir,
        &key,
        volume.root_dir_id(),
        &|dir, name| {
            names.classify_entry(Some(dir), name, true, |_| Err("not a long name"))
                == crate::format::names::Classified::Plain
        },
    )?;
    crate::io::plain_list::write_manifest(cipherdir, &key, &tags)?;
    let mut config = volume.config().clone();
    config.params.listed = true;
    config.seal(mk);
    config.save(&config_path(cipherdir))?;
    Ok(tags.len() as u64)
}

/// Gives every file header of sharing volume `volume` the volume MAC, then sets
/// `shared_header_mac` in its config.
fn authenticate_headers(volume: &Volume, cipherdir: &Path) -> Result<Upgraded> {
    let mut config = volume.config().clone();
    config.params.shared_header_mac = true;
    config.seal(volume.master_key());
    let to = Volume::from_master_key(config.clone(), volume.master_key())?;
    let mut files = Vec::new();
    for item in Walker::new(volume, cipherdir) {
        match item {
            Item::Entry(e) if e.kind == EntryType::File => files.push(e.backing),
            Item::Bad(b) => {
                return Err(Error::Refused(format!(
                    "{}: {}; upgrade would leave it unreadable: run `cloakfs fsck` first",
                    b.location(),
                    b.detail
                )))
            }
            _ => {}
        }
    }
    let mut done = Upgraded {
        config: true,
        ..Default::default()
    };
    for backing in &files {
        let wrote = crate::tools::share::reseal_header(volume, &to, backing)
            .map_err(|e| Error::Refused(format!("{}: {e}", backing.display())))?;
        done.headers += u64::from(wrote);
    }
    rustix::fs::syncfs(std::fs::File::open(cipherdir)?).map_err(std::io::Error::from)?;
    config.save(&config_path(cipherdir))?;
    Ok(done)
}
