//! `cloakfs upgrade`: brings a volume made by an older cloakfs to the current format, offline.
//!
//! The one step so far: a sharing volume without `shared_header_mac` (FORMAT.md section 18.2)
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
    /// Whether the config changed (false: the volume was current already).
    pub config: bool,
}

/// Upgrades the unmounted volume `volume` in `cipherdir` (see the module documentation).
pub fn upgrade(volume: &Volume, cipherdir: &Path) -> Result<Upgraded> {
    let params = &volume.config().params;
    if !volume.is_sharing() || params.shared_header_mac {
        return Ok(Upgraded::default());
    }
    crate::tools::rekey::check_not_rekeying(cipherdir)?;
    crate::tools::rekey::check_not_mounted(cipherdir)?;
    let _lock = crate::tools::rekey::lock_volume(cipherdir)?;
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
        headers: 0,
        config: true,
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
