//! Sharing single files of a sharing volume (FORMAT.md section 18) without a mount: list a
//! file's recipients, grant it to more, withdraw it from one (a fresh file key, the file
//! re-encrypted and swapped in atomically), and export it as a standard age file.
//!
//! Every function takes the backing path of a regular file of a volume joined as a member
//! ([`Volume::join_as`]); granting, withdrawing and exporting need the member's entry.

use crate::error::{Error, Result};
use crate::format::filekey::{recipient_lines, same_key, FileKeySource, SharedHeader, WrappedKeys};
use crate::io::file::ContentFile;
use crate::io::xattrs;
use crate::slots::recipient::{short_key, Recipients};
use crate::volume::Volume;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Prefix of the temporary file a withdrawal writes next to the file it replaces.
pub const TEMP_PREFIX: &str = "cloakfs.share.tmp.";

fn wrapped(volume: &Volume) -> Result<&WrappedKeys> {
    match volume.content().key_source() {
        FileKeySource::Wrapped(w) => Ok(w),
        FileKeySource::Derived(_) => Err(Error::Refused(
            "this volume is not a sharing volume (made without --sharing)".into(),
        )),
    }
}

/// A file's recipients, as stored in its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Each recipient's public key, in order.
    pub recipients: Vec<String>,
    /// Whether the list was authenticated (the member holds the file key); otherwise it is
    /// what the header claims.
    pub verified: bool,
}

/// Reads the header of the backing file `backing` (`None`: an empty file, with no header).
fn read_header(volume: &Volume, backing: &Path) -> Result<Option<SharedHeader>> {
    let w = wrapped(volume)?;
    let f = File::open(backing)?;
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(None);
    }
    let hl = volume.content().layout().header_len();
    if len < hl {
        return Err(Error::Tampered("file header truncated".into()));
    }
    let mut h = vec![0u8; hl as usize];
    f.read_exact_at(&mut h, 0)?;
    Ok(Some(w.parse_header(&h)?))
}

/// The recipients of the file at `backing`.
pub fn list(volume: &Volume, backing: &Path) -> Result<Listing> {
    let Some(h) = read_header(volume, backing)? else {
        return Ok(Listing {
            recipients: Vec::new(),
            verified: true,
        });
    };
    let w = wrapped(volume)?;
    let verified = match w.file_key(&h) {
        Ok(_) => true,
        Err(Error::AccessDenied(_)) => false,
        Err(e) => return Err(e),
    };
    Ok(Listing {
        recipients: h.recipients(),
        verified,
    })
}

/// Grants the file at `backing` to `recipients` (lines of `slots add --recipient` form);
/// returns how many were new.
pub fn add(volume: &Volume, backing: &Path, recipients: &str) -> Result<usize> {
    let new = recipient_lines(recipients)?;
    wrapped(volume)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(backing)?;
    ContentFile::open(volume.content().clone(), f)?.grant(&new)
}

/// Withdraws the file at `backing` from `recipient`: the file gets a fresh file ID and key,
/// granted to the remaining recipients, its contents re-encrypted into a temporary file next
/// to it that is then renamed over it (a crash leaves the old file or the new one, and at
/// worst a temporary that the next withdrawal or fsck removes).
pub fn remove(volume: &Volume, backing: &Path, recipient: &str) -> Result<()> {
    let target = recipient_lines(recipient)?;
    let [target] = &target[..] else {
        return Err(Error::Refused("give one recipient to remove".into()));
    };
    let w = wrapped(volume)?;
    let Some(h) = read_header(volume, backing)? else {
        return Err(Error::Refused(
            "the file is empty: it has no recipients yet".into(),
        ));
    };
    w.file_key(&h)?;
    if !h.grants.iter().any(|g| same_key(&g.recipient, target)) {
        return Err(Error::Refused(
            "that key is not a recipient of this file".into(),
        ));
    }
    let rest: Vec<String> = h
        .grants
        .iter()
        .map(|g| g.recipient.clone())
        .filter(|r| !same_key(r, target))
        .collect();
    if rest.is_empty() {
        return Err(Error::Refused(
            "that is the file's only recipient: nobody could open it afterwards".into(),
        ));
    }
    let meta = std::fs::symlink_metadata(backing)?;
    if meta.nlink() > 1 {
        return Err(Error::Refused(
            "the file has several names (hard links): withdrawing it is not supported".into(),
        ));
    }
    let old = ContentFile::open(volume.content().clone(), File::open(backing)?)?;
    let dir = backing.parent().unwrap_or(Path::new("."));
    let tmp = temp_path(dir);
    let result = (|| -> Result<()> {
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let (header, opened) = volume.content().fresh_header(&rest)?;
        out.write_all_at(&header, 0)?;
        let layout = volume.content().layout();
        let size = old.size();
        let mut plain = zeroize::Zeroizing::new(vec![0u8; layout.block_size() as usize]);
        for b in 0..layout.block_count(size) {
            let len = layout.block_len(b, size) as usize;
            let got = old.read_at(layout.plain_offset(b), &mut plain[..len])?;
            if got != len {
                return Err(Error::Tampered("file shorter than its size".into()));
            }
            let mut sealed = vec![0u8; len + layout.overhead() as usize];
            opened.cipher.seal(b, &plain[..len], &mut sealed);
            out.write_all_at(&sealed, layout.cipher_offset(b))?;
        }
        // The file keeps what its users see: owner (first: chown clears set-id bits), mode,
        // extended attributes (stored as they are: they are under the volume key, not the
        // file key) and times.
        let _ = rustix::fs::fchown(
            &out,
            Some(rustix::fs::Uid::from_raw(meta.uid())),
            Some(rustix::fs::Gid::from_raw(meta.gid())),
        );
        out.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        for name in xattrs::list(backing)? {
            let value = xattrs::get(backing, &name)?;
            match xattrs::set(&tmp, &name, &value) {
                Err(_) if name.starts_with(b"security.") => {}
                r => r?,
            }
        }
        let times = crate::tools::export::timestamps(&meta);
        rustix::fs::futimens(&out, &times).map_err(std::io::Error::from)?;
        out.sync_all()?;
        std::fs::rename(&tmp, backing)?;
        File::open(dir)?.sync_all()?;
        // After the rename, never before: a crash must not leave the only copy retired.
        w.retire(h.id)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Moves the volume MAC of the header of backing file `backing` from `from`'s header key to
/// `to`'s (FORMAT.md section 18.2): for a rekey (a new master key), or an upgrade (the MAC
/// made required). A header already right under `to` is left as it is; one that is right
/// under neither key is tampering. Only the MAC's 32 bytes are written, into the header's
/// zero padding. Returns whether it wrote.
pub fn reseal_header(from: &Volume, to: &Volume, backing: &Path) -> Result<bool> {
    let (from_keys, to_keys) = (wrapped(from)?, wrapped(to)?);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(backing)?;
    let len = f.metadata()?.len();
    let Some(bytes) = crate::io::header::read(to.content(), &f, len)? else {
        return Ok(false);
    };
    let h = SharedHeader::parse(&bytes)?;
    if to_keys.header_mac().check(&h).is_ok() {
        return Ok(false);
    }
    from_keys.header_mac().check(&h)?;
    let mac = to_keys.header_mac().compute(&h)?;
    f.write_all_at(&mac, h.volume_mac_offset()?)?;
    f.sync_data()?;
    Ok(true)
}

fn temp_path(dir: &Path) -> PathBuf {
    let n: [u8; 8] = crate::crypto::random::array();
    let hex: String = n.iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{TEMP_PREFIX}{hex}"))
}

/// Writes the plaintext of the file at `backing` to `out` as a standard age file (binary, or
/// ASCII-armored) encrypted to `recipients`: `age -d` decrypts it without cloakfs.
pub fn export(
    volume: &Volume,
    backing: &Path,
    recipients: &str,
    armor: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let r = Recipients::parse(recipients)?;
    let file = ContentFile::open(volume.content().clone(), File::open(backing)?)?;
    crate::slots::recipient::encrypt_stream(&r, armor, out, &mut |sink| {
        let mut buf = zeroize::Zeroizing::new(vec![0u8; 1 << 20]);
        let mut off = 0;
        loop {
            let n = file.read_at(off, &mut buf)?;
            if n == 0 {
                return Ok(());
            }
            sink.write_all(&buf[..n])?;
            off += n as u64;
        }
    })
}

/// The xattr of a backing directory that holds its default recipients (FORMAT.md section
/// 18.5), encrypted like any `user.` xattr under the volume key.
pub const DEFAULT_XATTR: &str = "user.cloakfs.share.default";

fn default_stored_name(volume: &Volume) -> Result<Vec<u8>> {
    volume
        .meta()
        .encrypt_xattr_name(DEFAULT_XATTR.as_bytes())?
        .ok_or_else(|| Error::Refused("default recipients xattr not encrypted".into()))
}

/// The default recipients of the backing directory at `dir` (a path, or a `/proc/self/fd`
/// path): every file made in it is granted to them besides its creator.
pub fn read_default(volume: &Volume, dir: &Path) -> Result<Vec<String>> {
    let name = default_stored_name(volume)?;
    let mut buf = vec![0u8; 65536];
    let n = match rustix::fs::getxattr(dir, name.as_slice(), &mut buf) {
        Ok(n) => n,
        Err(rustix::io::Errno::NODATA) | Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
        Err(e) => return Err(std::io::Error::from(e).into()),
    };
    let plain = volume.meta().decrypt_xattr_value(&name, &buf[..n])?;
    let text = String::from_utf8(plain)
        .map_err(|_| Error::Tampered("default recipients are not text".into()))?;
    Ok(text.lines().map(String::from).collect())
}

/// Sets the default recipients of the backing directory at `dir` (none: removes them).
pub fn write_default(volume: &Volume, dir: &Path, recipients: &[String]) -> Result<()> {
    let name = default_stored_name(volume)?;
    if recipients.is_empty() {
        return match rustix::fs::removexattr(dir, name.as_slice()) {
            Ok(()) | Err(rustix::io::Errno::NODATA) => Ok(()),
            Err(e) => Err(std::io::Error::from(e).into()),
        };
    }
    let sealed = volume
        .meta()
        .encrypt_xattr_value(&name, recipients.join("\n").as_bytes())?;
    rustix::fs::setxattr(
        dir,
        name.as_slice(),
        &sealed,
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(|e| std::io::Error::from(e).into())
}

/// What a default recipient that [`AllowedDefaults`] does not apply is shown with.
pub const NOT_APPLIED: &str = "(not applied: not set as a default by you on this machine; \
     `cloakfs share default DIR --recipient KEY` applies it)";

/// The default recipients (FORMAT.md section 18.5) that this user's mounts on this machine
/// apply: the keys the user set as defaults of the volume here (`share default`), and the
/// member's own. A directory's defaults are policy any member can write, so a key that another
/// member (or this user on another machine) put there is shown and reported, not applied,
/// until the user sets it here too: nobody makes the user's new files readable by a key
/// without the user's say.
///
/// Kept in `<state dir>/share-defaults/<b64 volume ID>`, one short key a line; read again at
/// each check, so what `cloakfs share default --volume` adds reaches running mounts.
pub struct AllowedDefaults {
    path: Option<PathBuf>,
    own: Option<String>,
}

impl AllowedDefaults {
    /// The allowed defaults of `volume` for this user (its member's own key always).
    pub fn for_volume(volume: &Volume) -> Self {
        let own = match volume.content().key_source() {
            FileKeySource::Wrapped(w) => w.member().map(|m| m.recipient().to_string()),
            FileKeySource::Derived(_) => None,
        };
        let id = crate::text::b64(&volume.config().params.volume_id);
        Self {
            path: crate::known_volumes::state_dir()
                .ok()
                .map(|d| d.join("share-defaults").join(id)),
            own,
        }
    }

    fn allowed(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|t| t.lines().map(String::from).collect())
            .unwrap_or_default();
        keys.extend(self.own.as_deref().map(short_key));
        keys
    }

    /// Records `recipients` as defaults this user set here.
    pub fn allow(&self, recipients: &[String]) -> Result<()> {
        let Some(path) = &self.path else {
            return Err(Error::Refused(
                "no state directory to record the default recipients in".into(),
            ));
        };
        let known = self.allowed();
        let new: String = recipients
            .iter()
            .map(|r| short_key(r))
            .filter(|k| !known.contains(k))
            .map(|k| format!("{k}\n"))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)?;
        f.write_all(new.as_bytes())?;
        Ok(())
    }

    /// `recipients` split into those applied here and those only shown.
    pub fn split(&self, recipients: Vec<String>) -> (Vec<String>, Vec<String>) {
        let allowed = self.allowed();
        recipients
            .into_iter()
            .partition(|r| allowed.contains(&short_key(r)))
    }
}

/// Copies the default recipients of directory `from` to the new directory `to` (a directory
/// made below inherits them). The sealed value is bound to its name only, so it is copied as
/// it is.
pub fn inherit_default(volume: &Volume, from: &Path, to: &Path) -> Result<()> {
    let name = default_stored_name(volume)?;
    let mut buf = vec![0u8; 65536];
    match rustix::fs::getxattr(from, name.as_slice(), &mut buf) {
        Ok(n) => rustix::fs::setxattr(
            to,
            name.as_slice(),
            &buf[..n],
            rustix::fs::XattrFlags::empty(),
        )
        .map_err(|e| std::io::Error::from(e).into()),
        Err(rustix::io::Errno::NODATA) | Err(rustix::io::Errno::NOTSUP) => Ok(()),
        Err(e) => Err(std::io::Error::from(e).into()),
    }
}
