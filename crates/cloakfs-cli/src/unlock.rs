//! Unlocking a volume from the secrets given on the command line. Every command that needs the
//! master key (mount, cat, fsck, ...) goes through [`unlock`], so each slot kind works everywhere.
//!
//! The pure-crypto slot kinds live in `cloakfs_core::slots`; the two that need I/O are here:
//! [`pkcs11`] (a key held on a token) and [`gpg`] (the gpg program and its agent).

pub mod gpg;
pub mod pkcs11;

use crate::args::UnlockArgs;
use crate::failure::{Failure, Result};
use crate::secret_input::{read_passphrase, read_secret_file, Confirm};
use cloakfs_core::crypto::secret::Passphrase;
use cloakfs_core::format::config::VolumeConfig;
use cloakfs_core::format::filekey::Member;
use cloakfs_core::known_volumes::{self, KnownVolumes, Pinned, Place};
use cloakfs_core::slots::recipient::{Identities, Loaded};
use cloakfs_core::slots::recovery::RecoveryKey;
use cloakfs_core::slots::shamir::Share;
use cloakfs_core::slots::{self, kind, KeySlot, Unlocked};
use cloakfs_core::text::b64;
use cloakfs_core::tools::rekey;
use cloakfs_core::Volume;
use std::path::Path;
use zeroize::Zeroizing;

/// Unlocks the volume at `cipherdir` (as the user named it) with the secrets in `args`.
pub fn unlock(args: &UnlockArgs, cipherdir: &Path) -> Result<Volume> {
    unlock_at(args, &Place::of(cipherdir))
}

/// Unlocks the volume at `place` (its config read from where it leads) with the secrets in
/// `args`.
pub fn unlock_at(args: &UnlockArgs, place: &Place) -> Result<Volume> {
    let config = VolumeConfig::load(&place.canonical)?;
    let u = open_config_unpinned(args, &config, |_| true)?;
    check_pinned(place, &config, &u)?;
    let volume = join_as_member(args, into_volume(config, u)?)?;
    volume.keep_retired_ids(&place.canonical);
    volume.keep_plaintext_list(&place.canonical);
    warn_about_plaintext_list(&volume);
    Ok(volume)
}

/// Says why an adopted tree shows fewer plaintext entries than it holds, or why it shows
/// any that appear: its manifest is unusable, or it was adopted before manifests.
fn warn_about_plaintext_list(volume: &Volume) {
    let p = &volume.config().params;
    if p.adopted && !p.listed {
        eprintln!(
            "Warning: this adopted tree has no manifest of its plaintext entries, so a \
             plaintext file put into the cipher directory is shown as one of yours; run \
             `cloakfs upgrade` to list the ones it holds."
        );
    } else if let Some(problem) = volume.plaintext_list_problem() {
        eprintln!(
            "Warning: the adopted tree's manifest of plaintext entries: {problem}; no \
             plaintext entry is shown (mount with --accept-plaintext to see them all)."
        );
    }
}

/// A sharing volume opened with `--identity` opens its files as that member: the identities
/// unwrap file keys, and new files are granted to the first identity's public key. With
/// `--gpg` the member also opens the files granted to a secret key of its gpg keyring
/// (`gpg:FINGERPRINT` entries); with `--gpg` alone, new files are granted to that keyring's
/// one secret key.
pub fn join_as_member(args: &UnlockArgs, volume: Volume) -> Result<Volume> {
    if !volume.is_sharing() || (args.identity.is_empty() && !args.gpg) {
        return Ok(volume);
    }
    if !volume.config().params.shared_header_mac {
        eprintln!(
            "cloakfs: warning: this sharing volume was made before file headers were \
             authenticated under the volume key: whoever can write its storage can plant a file \
             that you then read and write. Unmount it everywhere and run `cloakfs upgrade \
             CIPHERDIR` once."
        );
    }
    if args.identity.is_empty() {
        return Ok(volume.join_as(Member::gpg_only(Default::default(), None)?)?);
    }
    let raw = read_identities(args)?;
    let mut identities = Identities::new();
    for (p, raw) in args.identity.iter().zip(&raw) {
        identities.add_file(raw, &p.display().to_string(), TermCallbacks)?;
    }
    let recipient = public_key_of(&args.identity[0], &raw[0])?;
    let mut member = Member::new(identities, recipient)?;
    if args.gpg {
        member = member.with_gpg()?;
    }
    Ok(volume.join_as(member)?)
}

/// What a member of a sharing volume hands the multi-user daemon with its attach: the texts
/// of its identity files and its public key, and with `--gpg` where its gpg keyring is
/// (`None` for another volume, or without `--identity` and `--gpg`). Checked here as the
/// daemon will load them, so errors name the files.
pub fn member_keys(args: &UnlockArgs, volume: &Volume) -> Result<Option<MemberTexts>> {
    if !volume.is_sharing() || (args.identity.is_empty() && !args.gpg) {
        return Ok(None);
    }
    // The daemon runs gpg as this user, in the keyring this process would use.
    let gnupghome =
        match std::env::var_os("GNUPGHOME") {
            Some(g) => Some(std::path::absolute(&g).map_err(|e| {
                Failure::usage(format!("GNUPGHOME {}: {e}", Path::new(&g).display()))
            })?),
            None => None,
        };
    if args.identity.is_empty() {
        let member = Member::gpg_only(Default::default(), None)?;
        return Ok(Some(MemberTexts {
            texts: Vec::new(),
            recipient: member.recipient().to_string(),
            gpg: true,
            gnupghome,
        }));
    }
    let raw = read_identities(args)?;
    let mut texts = Vec::new();
    for (p, raw) in args.identity.iter().zip(&raw) {
        let text = std::str::from_utf8(raw).map_err(|_| {
            Failure::usage(format!("identity file {}: not a text file", p.display()))
        })?;
        texts.push(Zeroizing::new(text.to_string()));
    }
    let recipient = public_key_of(&args.identity[0], &raw[0])?;
    let named: Vec<(String, &[u8])> = (args.identity.iter().zip(&texts))
        .map(|(p, t)| (p.display().to_string(), t.as_bytes()))
        .collect();
    let member = Member::from_texts(&named, recipient.clone())?;
    if args.gpg {
        member.with_gpg()?;
    }
    Ok(Some(MemberTexts {
        texts,
        recipient,
        gpg: args.gpg,
        gnupghome,
    }))
}

/// The contents of the `--identity` files.
fn read_identities(args: &UnlockArgs) -> Result<Vec<Zeroizing<Vec<u8>>>> {
    (args.identity.iter())
        .map(|p| read_secret_file(p, "identity file", 1 << 20))
        .collect()
}

/// A sharing volume member's keys on their way to the daemon (wiped when dropped).
pub struct MemberTexts {
    pub texts: Vec<Zeroizing<String>>,
    pub recipient: String,
    /// `--gpg`: the member's gpg keyring opens its gpg entries.
    pub gpg: bool,
    /// `$GNUPGHOME` (absolute), if set: also where recipients' gpg public keys are.
    pub gnupghome: Option<std::path::PathBuf>,
}

/// The public key of identity file `path`, whose contents are `raw`: an age identity's own,
/// or an ssh key's from the `.pub` file next to it.
fn public_key_of(path: &Path, raw: &[u8]) -> Result<String> {
    let text = std::str::from_utf8(raw).unwrap_or_default();
    if text.contains("PRIVATE KEY-----") {
        let mut pub_path = path.as_os_str().to_owned();
        pub_path.push(".pub");
        return std::fs::read_to_string(&pub_path)
            .map(|s| s.trim().to_string())
            .map_err(|e| {
                Failure::usage(format!(
                    "cannot tell the public key of ssh key {}: {} ({e})",
                    path.display(),
                    Path::new(&pub_path).display()
                ))
            });
    }
    for line in text.lines().map(str::trim) {
        if line.starts_with("AGE-SECRET-KEY-") {
            if let Ok(id) = line.parse::<age::x25519::Identity>() {
                return Ok(id.to_public().to_string());
            }
        }
    }
    Err(Failure::usage(format!(
        "identity file {} holds no age X25519 identity whose public key could own new files",
        path.display()
    )))
}

/// Checks the key that opened the volume at `place` against the one this machine remembers
/// for it (key pinning, [`cloakfs_core::known_volumes`]); a first use is judged by what the
/// volume's root holds ([`known_volumes::vet_first_use`]), then remembered, and said. Every
/// unlock goes through here.
pub fn check_pinned(place: &Place, config: &VolumeConfig, u: &Unlocked) -> Result<()> {
    let id = config.params.volume_id;
    let fp = u.master_key.fingerprint(&id);
    let known = KnownVolumes::for_this_user()?;
    let rekeying = rekey::journal_path(&place.canonical).exists();
    let first_use = || {
        let volume = Volume::from_master_key(config.clone(), &u.master_key)?;
        if let Some(warning) = known_volumes::vet_first_use(&volume, place)? {
            eprintln!("cloakfs: warning: {warning}");
        }
        Ok(())
    };
    match known.check(place, &id, &fp, rekeying, first_use)? {
        Pinned::Known => {}
        Pinned::FirstUse => eprintln!(
            "cloakfs: first use of volume {} on this machine; its master-key fingerprint is {fp} \
             (remembered in {})",
            b64(&id),
            known.path().display()
        ),
        Pinned::NotRemembered(why) => eprintln!(
            "cloakfs: warning: volume {} cannot be remembered on this machine ({why}), so a \
             replaced config would go unnoticed; its master-key fingerprint is {fp}",
            b64(&id)
        ),
    }
    Ok(())
}

/// The unlocked volume, remembering which slot opened it (for rekey).
pub fn into_volume(config: VolumeConfig, u: Unlocked) -> Result<Volume> {
    let v = Volume::from_master_key(config, &u.master_key)?;
    Ok(match u.kek {
        Some(kek) => v.with_unlocked_slot(u.slot_id, kek),
        None => v,
    })
}

/// Opens `config` (of the volume at `cipherdir`) with the secrets in `args`, trying only the
/// slots `allow` accepts. The config MAC is verified, and the key checked against the one
/// this machine remembers ([`check_pinned`]).
pub fn open_config(
    args: &UnlockArgs,
    config: &VolumeConfig,
    cipherdir: &Path,
    allow: impl Fn(&KeySlot) -> bool,
) -> Result<Unlocked> {
    let u = open_config_unpinned(args, config, allow)?;
    check_pinned(&Place::of(cipherdir), config, &u)?;
    Ok(u)
}

/// [`open_config`] without the pinning check: only for `cloakfs known accept`, which shows
/// the user what changed and asks before it trusts the key.
pub fn open_config_unpinned(
    args: &UnlockArgs,
    config: &VolumeConfig,
    allow: impl Fn(&KeySlot) -> bool,
) -> Result<Unlocked> {
    if !config.has_stored_key() {
        check_stdin_once(args)?;
        if args.has_other_secret() || args.slot.is_some() {
            return Err(Failure::usage(
                "this volume has no stored key (made with --no-stored-key): it has no key slots \
                 and opens only with its passphrase",
            ));
        }
        let pass = read_passphrase(args, "Passphrase: ", Confirm::Once)?;
        return Ok(config.unlock_passphrase_full(&pass)?);
    }
    Session::read(args, config)?.open_unpinned(config, allow)
}

/// Secrets read once, to try against the slots of one config (possibly several times).
pub struct Session<'a> {
    args: &'a UnlockArgs,
    secrets: Secrets,
    token: Option<pkcs11::Unlocker<'a>>,
}

impl<'a> Session<'a> {
    /// Reads the secrets in `args` (prompting for a passphrase if no secret is given).
    pub fn read(args: &'a UnlockArgs, config: &VolumeConfig) -> Result<Self> {
        check_stdin_once(args)?;
        if !config.has_stored_key() {
            return Err(Failure::usage(
                "this volume has no stored key (made with --no-stored-key): it has no key slots",
            ));
        }
        if let Some(id) = args.slot {
            if config.slot(id).is_none() {
                return Err(Failure::usage(format!(
                    "this volume has no key slot {id} (see cloakfs slots list)"
                )));
            }
        }
        let usable = |s: &KeySlot| args.slot.is_none_or(|id| id == s.id());
        let secrets = Secrets::read(args, config, &usable)?;
        let token = args.pkcs11_module.as_deref().map(|m| {
            pkcs11::Unlocker::new(m, args.pkcs11_token.as_deref(), args.pin_file.as_deref())
        });
        Ok(Self {
            args,
            secrets,
            token,
        })
    }

    /// Tries the slots that `allow` accepts (and `--slot`, if given), and checks the key
    /// against the one this machine remembers for the volume at `cipherdir`.
    pub fn open(
        &mut self,
        config: &VolumeConfig,
        cipherdir: &Path,
        allow: impl Fn(&KeySlot) -> bool,
    ) -> Result<Unlocked> {
        let u = self.open_unpinned(config, allow)?;
        check_pinned(&Place::of(cipherdir), config, &u)?;
        Ok(u)
    }

    /// [`Session::open`] without the pinning check, to learn which slots a secret opens.
    pub fn open_unpinned(
        &mut self,
        config: &VolumeConfig,
        allow: impl Fn(&KeySlot) -> bool,
    ) -> Result<Unlocked> {
        let args = self.args;
        let secrets = &self.secrets;
        let token = &mut self.token;
        let volume_id = config.params.volume_id;
        config.unlock_with(|slot: &KeySlot| -> Result<Option<slots::Kek>> {
            if !allow(slot) || args.slot.is_some_and(|id| id != slot.id()) {
                return Ok(None);
            }
            Ok(match slot.kind() {
                kind::PASSPHRASE => match &secrets.pass {
                    Some(p) => Some(slots::passphrase::kek(slot, p)?),
                    None => None,
                },
                kind::KEYFILE => match &secrets.keyfile {
                    Some(k) => Some(slots::keyfile::kek(slot, k)?),
                    None => None,
                },
                kind::RECOVERY => match &secrets.recovery {
                    Some(k) => Some(slots::recovery::kek(slot, k)?),
                    None => None,
                },
                kind::RECIPIENT => slots::recipient::kek(slot, &secrets.identities)?,
                kind::SHAMIR => slots::shamir::kek(slot, &volume_id, &secrets.shares)?,
                kind::PKCS11 => match token {
                    Some(t) => t.kek(slot, &volume_id)?,
                    None => None,
                },
                kind::GPG if args.gpg => gpg::kek(slot)?,
                _ => None,
            })
        })
    }
}

/// The secrets read up front (PKCS#11 and gpg are asked per slot).
struct Secrets {
    pass: Option<Passphrase>,
    keyfile: Option<Zeroizing<Vec<u8>>>,
    recovery: Option<RecoveryKey>,
    identities: Identities,
    shares: Vec<Share>,
}

impl Secrets {
    fn read(
        args: &UnlockArgs,
        config: &VolumeConfig,
        usable: &dyn Fn(&KeySlot) -> bool,
    ) -> Result<Self> {
        let has_kind = |k: &str| config.slots().iter().any(|s| s.kind() == k && usable(s));
        let explicit_pass = args.passfile.is_some() || args.extpass.is_some();
        let pass = if explicit_pass {
            Some(read_passphrase(args, "Passphrase: ", Confirm::Once)?)
        } else if !args.has_other_secret() {
            if !has_kind(kind::PASSPHRASE) {
                return Err(Failure::new(
                    crate::failure::code::WRONG_SECRET,
                    format!(
                        "this volume has no passphrase slot to prompt for: unlock it with \
                         --keyfile, --identity, --pkcs11-module, --gpg, --share or \
                         --recovery-key-file (its slots: {})",
                        kinds(config)
                    ),
                ));
            }
            Some(read_passphrase(args, "Passphrase: ", Confirm::Once)?)
        } else {
            None
        };
        let keyfile = match &args.keyfile {
            Some(p) => Some(read_secret_file(p, "key file", slots::keyfile::MAX_LEN)?),
            None => None,
        };
        let recovery = match &args.recovery_key_file {
            Some(p) => {
                let raw = read_secret_file(p, "recovery key file", 4096)?;
                let text = std::str::from_utf8(&raw).map_err(|_| {
                    Failure::usage(format!("recovery key file {} is not text", p.display()))
                })?;
                Some(RecoveryKey::parse(text)?)
            }
            None => None,
        };
        let mut identities = Identities::new();
        for p in &args.identity {
            let raw = read_secret_file(p, "identity file", 1 << 20)?;
            let loaded = identities.add_file(&raw, &p.display().to_string(), TermCallbacks)?;
            if loaded == Loaded::EncryptedSsh
                && std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/tty")
                    .is_err()
            {
                return Err(Failure::usage(format!(
                    "ssh key {} is protected by a passphrase and there is no terminal to ask \
                     for it on",
                    p.display()
                )));
            }
        }
        let mut shares = Vec::new();
        for p in &args.share {
            shares.push(read_share(p, config, &identities)?);
        }
        Ok(Self {
            pass,
            keyfile,
            recovery,
            identities,
            shares,
        })
    }
}

/// Reads a share file, checking that it belongs to this volume and to one of its shamir slots.
fn read_share(path: &Path, config: &VolumeConfig, ids: &Identities) -> Result<Share> {
    let raw = read_secret_file(path, "share file", 64 * 1024)?;
    let raw = if raw.starts_with(b"-----BEGIN AGE ENCRYPTED FILE-----") {
        if ids.is_empty() {
            return Err(Failure::usage(format!(
                "share file {} is encrypted with age: give the --identity that decrypts it",
                path.display()
            )));
        }
        match slots::recipient::decrypt_armored(&raw, ids)? {
            Some(pt) => pt,
            None => {
                return Err(Failure::new(
                    crate::failure::code::WRONG_SECRET,
                    format!(
                        "share file {}: none of the identities given decrypts it",
                        path.display()
                    ),
                ))
            }
        }
    } else {
        raw
    };
    let text = std::str::from_utf8(&raw)
        .map_err(|_| Failure::usage(format!("share file {} is not text", path.display())))?;
    let share = Share::parse(text).map_err(|e| {
        let f = Failure::from(e);
        Failure::new(
            f.code,
            format!("share file {}: {}", path.display(), f.message),
        )
    })?;
    let vid = config.params.volume_id;
    if share.volume_id != vid {
        return Err(Failure::new(
            crate::failure::code::WRONG_SECRET,
            format!(
                "share file {} belongs to another volume (ID {}), not to this one (ID {})",
                path.display(),
                b64(&share.volume_id),
                b64(&vid)
            ),
        ));
    }
    match config.slot(share.slot_id) {
        Some(s) if s.kind() == kind::SHAMIR => Ok(share),
        _ => Err(Failure::new(
            crate::failure::code::WRONG_SECRET,
            format!(
                "share file {} is for key slot {}, which this volume no longer has as a shamir \
                 slot",
                path.display(),
                share.slot_id
            ),
        )),
    }
}

/// At most one secret may come from standard input.
fn check_stdin_once(args: &UnlockArgs) -> Result<()> {
    let dash = |p: &Option<std::path::PathBuf>| p.as_deref() == Some(Path::new("-"));
    let n = [
        &args.passfile,
        &args.keyfile,
        &args.pin_file,
        &args.recovery_key_file,
    ]
    .iter()
    .filter(|p| dash(p))
    .count()
        + args
            .identity
            .iter()
            .chain(&args.share)
            .filter(|p| p.as_path() == Path::new("-"))
            .count();
    if n > 1 {
        return Err(Failure::usage(
            "only one secret can be read from standard input (\"-\")",
        ));
    }
    Ok(())
}

/// The slot kinds of a volume, for messages.
pub fn kinds(config: &VolumeConfig) -> String {
    let k: Vec<String> = config
        .slots()
        .iter()
        .map(|s| format!("{} {}", s.id(), s.kind()))
        .collect();
    if k.is_empty() {
        "none".into()
    } else {
        k.join(", ")
    }
}

/// Asks on the terminal for the passphrase of an encrypted ssh key.
#[derive(Clone)]
pub struct TermCallbacks;

impl age::Callbacks for TermCallbacks {
    fn display_message(&self, message: &str) {
        eprintln!("{message}");
    }

    fn confirm(&self, _message: &str, _yes: &str, _no: Option<&str>) -> Option<bool> {
        None
    }

    fn request_public_string(&self, _description: &str) -> Option<String> {
        None
    }

    fn request_passphrase(&self, description: &str) -> Option<age::secrecy::SecretString> {
        let p = rpassword::prompt_password(format!("{description} ")).ok()?;
        Some(p.into())
    }
}
