//! `cloakfs slots list|add|remove|test`: manage the key slots that wrap the master key.
//!
//! Every change is one atomic config write (temporary file, fsync, rename, fsync directory), so
//! a crash leaves the old or the new config, each of which opens with the secrets it lists.

use crate::args::UnlockArgs;
use crate::failure::{code, Failure, Result};
use crate::secret_input::{read_passphrase_from, read_secret_file, Confirm};
use crate::unlock::{self, gpg, pkcs11};
use cloakfs_core::crypto::kdf::{Argon2Params, DEFAULT_MEMORY_KIB};
use cloakfs_core::format::config::{FileKeys, KeySource, VolumeConfig};
use cloakfs_core::slots::recipient::Recipients;
use cloakfs_core::slots::recovery::RecoveryKey;
use cloakfs_core::slots::{self, kind, KeySlot, SlotRandomness};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, clap::Subcommand)]
pub enum SlotsCommand {
    /// List the key slots: IDs, kinds, labels and non-secret parameters (no secret needed).
    List {
        /// Print JSON instead of lines: an array of slots (`id`, `kind`, `label`, `details`
        /// and the kind's non-secret parameters).
        #[arg(long)]
        json: bool,
        /// The volume's cipher directory (or its config file).
        cipherdir: PathBuf,
    },
    /// Add a key slot (unlock with an existing secret, then give exactly one new secret).
    Add(Box<AddArgs>),
    /// Remove a key slot (unlock with another slot than the one removed).
    Remove(RemoveArgs),
    /// Check which key slot the given secrets open, without changing anything.
    Test(TestArgs),
}

/// Argon2id cost of a new passphrase slot.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KdfArgs {
    /// Calibrate Argon2id (64 MiB) to take this long here, in milliseconds.
    #[arg(long, value_name = "MS")]
    pub kdf_time: Option<u64>,
    /// Argon2id memory in KiB (skips calibration).
    #[arg(long, value_name = "KIB")]
    pub kdf_memory: Option<u32>,
    /// Argon2id iterations (skips calibration).
    #[arg(long, value_name = "N")]
    pub kdf_iterations: Option<u32>,
}

impl KdfArgs {
    /// The parameters asked for; `default` (else a 500 ms calibration) when none is given.
    pub fn resolve(&self, default: Option<Argon2Params>) -> Result<Argon2Params> {
        let p = match (self.kdf_memory, self.kdf_iterations, self.kdf_time, default) {
            (None, None, None, Some(d)) => d,
            (None, None, t, _) => Argon2Params::calibrate(Duration::from_millis(t.unwrap_or(500))),
            (m, t, _, _) => Argon2Params {
                memory_kib: m.unwrap_or(DEFAULT_MEMORY_KIB),
                iterations: t.unwrap_or(3),
                lanes: 1,
            },
        };
        p.validate()
            .map_err(|e| Failure::usage(format!("KDF parameters: {e}")))?;
        Ok(p)
    }
}

/// The secrets that unlock the volume for `slots add`. Options whose names `slots add` uses for
/// the new slot are prefixed with `--unlock-`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AddUnlockArgs {
    /// Unlock with the passphrase on the first line of FILE ("-" for standard input).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "extpass",
        help_heading = "Unlocking"
    )]
    pub passfile: Option<PathBuf>,
    /// Unlock with the passphrase that CMD prints.
    #[arg(long, value_name = "CMD", help_heading = "Unlocking")]
    pub extpass: Option<String>,
    /// Unlock with a key file ("-" for standard input).
    #[arg(long, value_name = "FILE", help_heading = "Unlocking")]
    pub unlock_keyfile: Option<PathBuf>,
    /// Unlock with an age identity file or ssh private key (repeatable).
    #[arg(long, value_name = "FILE", help_heading = "Unlocking")]
    pub identity: Vec<PathBuf>,
    /// Unlock with a PKCS#11 token through this module.
    #[arg(long, value_name = "SO", help_heading = "Unlocking")]
    pub unlock_pkcs11_module: Option<PathBuf>,
    /// Label of the token to unlock with (default: the slot's).
    #[arg(
        long,
        value_name = "LABEL",
        requires = "unlock_pkcs11_module",
        help_heading = "Unlocking"
    )]
    pub unlock_pkcs11_token: Option<String>,
    /// PIN of the token to unlock with (first line of FILE).
    #[arg(
        long,
        value_name = "FILE",
        requires = "unlock_pkcs11_module",
        help_heading = "Unlocking"
    )]
    pub unlock_pin_file: Option<PathBuf>,
    /// Unlock a gpg slot through gpg-agent.
    #[arg(long, help_heading = "Unlocking")]
    pub gpg: bool,
    /// Unlock with Shamir share files (repeatable).
    #[arg(long, value_name = "FILE", help_heading = "Unlocking")]
    pub share: Vec<PathBuf>,
    /// Unlock with a recovery key read from FILE.
    #[arg(long, value_name = "FILE", help_heading = "Unlocking")]
    pub recovery_key_file: Option<PathBuf>,
    /// Try only the key slot with this ID.
    #[arg(long, value_name = "ID", help_heading = "Unlocking")]
    pub slot: Option<u32>,
}

impl AddUnlockArgs {
    fn to_unlock(&self) -> UnlockArgs {
        UnlockArgs {
            passfile: self.passfile.clone(),
            extpass: self.extpass.clone(),
            keyfile: self.unlock_keyfile.clone(),
            identity: self.identity.clone(),
            pkcs11_module: self.unlock_pkcs11_module.clone(),
            pkcs11_token: self.unlock_pkcs11_token.clone(),
            pin_file: self.unlock_pin_file.clone(),
            gpg: self.gpg,
            share: self.share.clone(),
            recovery_key_file: self.recovery_key_file.clone(),
            slot: self.slot,
        }
    }
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("new").required(true).multiple(false)))]
pub struct AddArgs {
    #[command(flatten)]
    pub unlock: AddUnlockArgs,
    /// New passphrase slot: the passphrase is the first line of FILE.
    #[arg(long, value_name = "FILE", group = "new")]
    pub new_passfile: Option<PathBuf>,
    /// New passphrase slot: the passphrase is the first line CMD prints.
    #[arg(long, value_name = "CMD", group = "new")]
    pub new_extpass: Option<String>,
    /// New passphrase slot: prompt for the passphrase (twice, without echo).
    #[arg(long, group = "new")]
    pub new_passphrase: bool,
    /// New key-file slot: all bytes of FILE ("-" for standard input; at least 16 bytes).
    #[arg(long, value_name = "FILE", group = "new")]
    pub keyfile: Option<PathBuf>,
    /// New recipient slot: an age (age1...) or ssh (ssh-ed25519, ssh-rsa) public key, or a
    /// file of them, one per line (repeatable; any one of them unlocks).
    #[arg(long, value_name = "PUBKEY|FILE", group = "new")]
    pub recipient: Vec<String>,
    /// New PKCS#11 slot: a key generated on the token (never leaves it) through this module.
    #[arg(long, value_name = "SO", group = "new", requires = "pkcs11_token")]
    pub pkcs11_module: Option<PathBuf>,
    /// Label of the token for the new PKCS#11 slot.
    #[arg(long, value_name = "LABEL", requires = "pkcs11_module")]
    pub pkcs11_token: Option<String>,
    /// PIN of that token, first line of FILE (default: prompt without echo).
    #[arg(long, value_name = "FILE", requires = "pkcs11_module")]
    pub pin_file: Option<PathBuf>,
    /// New gpg slot: encrypted by gpg to this OpenPGP key (repeatable; any one unlocks).
    #[arg(long, value_name = "KEYID", group = "new")]
    pub gpg_recipient: Vec<String>,
    /// New Shamir slot: M of N shares open it, written to --share-dir.
    #[arg(long, value_name = "M/N", group = "new", requires = "share_dir")]
    pub shamir: Option<String>,
    /// Directory for the N share files (created if missing; files are mode 0600).
    #[arg(long, value_name = "DIR", requires = "shamir")]
    pub share_dir: Option<PathBuf>,
    /// Encrypt share i to the i-th of these age/ssh recipients (give exactly N of them).
    #[arg(long, value_name = "PUBKEY|FILE", requires = "shamir")]
    pub share_recipient: Vec<String>,
    /// New recovery slot: a random recovery key, printed once.
    #[arg(long, group = "new")]
    pub recovery: bool,
    /// The new slot's label (stored in the clear).
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub label: String,
    /// Argon2id cost of a new passphrase slot (default: calibrated to 500 ms).
    #[command(flatten)]
    pub kdf: KdfArgs,
    /// The volume's cipher directory (or its config file).
    pub cipherdir: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct RemoveArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// The volume's cipher directory (or its config file).
    pub cipherdir: PathBuf,
    /// The ID of the slot to remove (see `cloakfs slots list`).
    pub slot_id: u32,
}

#[derive(Debug, clap::Args)]
pub struct TestArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// The volume's cipher directory (or its config file).
    pub cipherdir: PathBuf,
}

pub fn run(cmd: SlotsCommand) -> Result<()> {
    match cmd {
        SlotsCommand::List { cipherdir, json } => list(&cipherdir, json),
        SlotsCommand::Add(a) => add(*a),
        SlotsCommand::Remove(a) => remove(a),
        SlotsCommand::Test(a) => test(a),
    }
}

/// One line describing a slot, without any secret: ID, kind, label and public parameters.
pub fn describe(s: &KeySlot) -> String {
    let mut line = format!("slot {}: {} ({})", s.id(), s.kind(), details(s));
    if !s.label().is_empty() {
        line.push_str(&format!(" label {:?}", s.label()));
    }
    line
}

/// A key slot as JSON: what [`describe`] says, and the kind's non-secret parameters as fields
/// (never wrapped keys, salts or nonces).
pub fn describe_json(s: &KeySlot) -> serde_json::Value {
    let f = s.fields();
    let field = |k: &str| f.get(k).cloned();
    let mut v = serde_json::json!({
        "id": s.id(),
        "kind": s.kind(),
        "label": s.label(),
        "details": details(s),
    });
    let extra = match s.kind() {
        kind::PASSPHRASE => s.argon2().ok().map(|a| {
            serde_json::json!({ "argon2id": {
                "memory_kib": a.memory_kib, "iterations": a.iterations, "lanes": a.lanes
            }})
        }),
        kind::RECIPIENT => Some(serde_json::json!({ "recipient_types": field("recipient_types") })),
        kind::SHAMIR => Some(serde_json::json!({
            "threshold": field("threshold").and_then(|t| t.parse::<u32>().ok()),
            "shares": field("shares").and_then(|t| t.parse::<u32>().ok()),
        })),
        kind::PKCS11 => Some(serde_json::json!({ "pkcs11_token": field("pkcs11_token") })),
        kind::GPG => Some(serde_json::json!({ "gpg_recipients": field("gpg_recipients") })),
        _ => None,
    };
    if let (Some(obj), Some(serde_json::Value::Object(more))) = (v.as_object_mut(), extra) {
        obj.extend(more);
    }
    v
}

/// The non-secret parameters of a slot, in words.
fn details(s: &KeySlot) -> String {
    let f = s.fields();
    let get = |k: &str| f.get(k).map(String::as_str).unwrap_or("?");
    match s.kind() {
        kind::PASSPHRASE => match s.argon2() {
            Ok(a) => format!(
                "argon2id m={} KiB t={} p={}",
                a.memory_kib, a.iterations, a.lanes
            ),
            Err(e) => format!("damaged: {e}"),
        },
        kind::KEYFILE => "HKDF-SHA256 of the key file".into(),
        kind::RECOVERY => "recovery key".into(),
        kind::RECIPIENT => format!("age to {}", get("recipient_types")),
        kind::SHAMIR => format!("any {} of {} shares", get("threshold"), get("shares")),
        kind::PKCS11 => format!("HMAC key on PKCS#11 token {:?}", get("pkcs11_token")),
        kind::GPG => format!("gpg to {}", get("gpg_recipients")),
        _ => "unknown kind (made by a newer cloakfs?): kept, never used to unlock".into(),
    }
}

/// The key source of a volume without stored key, for display.
pub fn describe_key_source(c: &VolumeConfig) -> Option<String> {
    match c.key_source() {
        KeySource::Slots => None,
        KeySource::Passphrase { kdf, .. } => Some(format!(
            "no stored key: master key = Argon2id(passphrase) (m={} KiB t={} p={}); no key slots",
            kdf.memory_kib, kdf.iterations, kdf.lanes
        )),
    }
}

fn list(cipherdir: &Path, json: bool) -> Result<()> {
    let c = VolumeConfig::load(cipherdir)?;
    if json {
        let slots: Vec<serde_json::Value> = c.slots().iter().map(describe_json).collect();
        println!("{}", serde_json::Value::Array(slots));
        return Ok(());
    }
    if let Some(k) = describe_key_source(&c) {
        println!("{k}");
        return Ok(());
    }
    for s in c.slots() {
        println!("{}", describe(s));
    }
    Ok(())
}

fn test(args: TestArgs) -> Result<()> {
    let config = VolumeConfig::load(&args.cipherdir)?;
    let u = unlock::open_config(&args.unlock, &config, &args.cipherdir, |_| true)?;
    match config.slot(u.slot_id) {
        Some(s) => println!("{} opens the volume.", describe(s)),
        None => println!("The passphrase opens the volume (no stored key)."),
    }
    Ok(())
}

fn refuse_no_stored_key(c: &VolumeConfig) -> Result<()> {
    if c.has_stored_key() {
        Ok(())
    } else {
        Err(Failure::usage(
            "this volume has no stored key (made with --no-stored-key): it cannot have key slots",
        ))
    }
}

fn remove(args: RemoveArgs) -> Result<()> {
    let mut config = VolumeConfig::load(&args.cipherdir)?;
    refuse_no_stored_key(&config)?;
    let target = args.slot_id;
    let desc = describe(config.slot(target).ok_or_else(|| {
        Failure::usage(format!(
            "this volume has no key slot {target} (see cloakfs slots list)"
        ))
    })?);
    let refusal = || {
        Failure::usage(format!(
            "refusing to remove key slot {target}: it is the only slot that the secret given \
             opens, so you would lock yourself out; unlock with another slot to remove it"
        ))
    };
    if args.unlock.slot == Some(target) {
        return Err(refusal());
    }
    let mut session = unlock::Session::read(&args.unlock, &config)?;
    let u = match session.open(&config, &args.cipherdir, |s| s.id() != target) {
        Ok(u) => u,
        Err(e) => {
            if session.open_unpinned(&config, |s| s.id() == target).is_ok() {
                return Err(refusal());
            }
            return Err(e);
        }
    };
    config.remove_slot(target)?;
    config.seal(&u.master_key);
    config.save(&args.cipherdir)?;
    println!("Removed {desc}.");
    Ok(())
}

/// Parses `--recipient` values: a key string, or a file of them.
pub(crate) fn recipients_text(values: &[String]) -> Result<String> {
    let mut text = String::new();
    for v in values {
        let p = Path::new(v);
        if !v.starts_with("age1") && !v.starts_with("ssh-") && p.is_file() {
            let t = std::fs::read_to_string(p)
                .map_err(|e| Failure::usage(format!("cannot read recipients file {v}: {e}")))?;
            text.push_str(&t);
        } else {
            text.push_str(v);
        }
        text.push('\n');
    }
    Ok(text)
}

fn parse_recipients(values: &[String]) -> Result<Recipients> {
    Ok(Recipients::parse(&recipients_text(values)?)?)
}

fn parse_m_of_n(s: &str) -> Result<(u8, u8)> {
    let bad = || Failure::usage(format!("--shamir {s:?}: expected M/N, e.g. 2/3"));
    let (m, n) = s.split_once('/').ok_or_else(bad)?;
    let m: u32 = m.trim().parse().map_err(|_| bad())?;
    let n: u32 = n.trim().parse().map_err(|_| bad())?;
    slots::shamir::check_m_of_n(m, n).map_err(|e| Failure::usage(format!("--shamir {s}: {e}")))
}

/// What the new slot is, checked before unlocking.
enum NewSlot {
    Passphrase,
    Keyfile(zeroize::Zeroizing<Vec<u8>>),
    Recipient(Recipients),
    Pkcs11 {
        module: PathBuf,
        token: String,
    },
    Gpg(Vec<String>),
    Shamir {
        m: u8,
        n: u8,
        dir: PathBuf,
        recipients: Vec<Recipients>,
    },
    Recovery,
}

fn plan(args: &AddArgs) -> Result<NewSlot> {
    if args.new_passfile.is_some() || args.new_extpass.is_some() || args.new_passphrase {
        return Ok(NewSlot::Passphrase);
    }
    if let Some(p) = &args.keyfile {
        let data = read_secret_file(p, "key file", slots::keyfile::MAX_LEN)?;
        if data.len() < slots::keyfile::MIN_NEW_LEN {
            return Err(Failure::usage(format!(
                "key file {} is too short ({} bytes): use at least {} random bytes, e.g. \
                 head -c 64 /dev/urandom > FILE",
                p.display(),
                data.len(),
                slots::keyfile::MIN_NEW_LEN
            )));
        }
        return Ok(NewSlot::Keyfile(data));
    }
    if !args.recipient.is_empty() {
        return Ok(NewSlot::Recipient(parse_recipients(&args.recipient)?));
    }
    if let Some(module) = &args.pkcs11_module {
        let token = args.pkcs11_token.clone().expect("clap requires it");
        return Ok(NewSlot::Pkcs11 {
            module: module.clone(),
            token,
        });
    }
    if !args.gpg_recipient.is_empty() {
        return Ok(NewSlot::Gpg(args.gpg_recipient.clone()));
    }
    if let Some(s) = &args.shamir {
        let (m, n) = parse_m_of_n(s)?;
        let dir = args.share_dir.clone().expect("clap requires it");
        let recipients = args
            .share_recipient
            .iter()
            .map(|r| parse_recipients(std::slice::from_ref(r)))
            .collect::<Result<Vec<_>>>()?;
        if !recipients.is_empty() && recipients.len() != n as usize {
            return Err(Failure::usage(format!(
                "--share-recipient given {} times for {n} shares: give one per share",
                recipients.len()
            )));
        }
        return Ok(NewSlot::Shamir {
            m,
            n,
            dir,
            recipients,
        });
    }
    if args.recovery {
        return Ok(NewSlot::Recovery);
    }
    Err(Failure::usage("say which slot to add"))
}

fn add(args: AddArgs) -> Result<()> {
    let mut config = VolumeConfig::load(&args.cipherdir)?;
    refuse_no_stored_key(&config)?;
    if args.label.contains(['\n', '\0']) {
        return Err(Failure::usage("a slot label may not contain a newline"));
    }
    let unlock_args = args.unlock.to_unlock();
    let dash = |p: &Option<PathBuf>| p.as_deref() == Some(Path::new("-"));
    if (dash(&args.keyfile) || dash(&args.new_passfile) || dash(&args.pin_file))
        && (dash(&unlock_args.passfile)
            || dash(&unlock_args.keyfile)
            || dash(&unlock_args.recovery_key_file)
            || dash(&unlock_args.pin_file))
    {
        return Err(Failure::usage(
            "only one secret can be read from standard input (\"-\")",
        ));
    }
    let new = plan(&args)?;
    if let NewSlot::Shamir { dir, .. } = &new {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::other(format!("share directory {}: {e}", dir.display())))?;
    }
    let u = unlock::open_config(&unlock_args, &config, &args.cipherdir, |_| true)?;
    let mk = &u.master_key;
    let volume_id = config.params.volume_id;
    let id = config.next_slot_id();
    let rnd = SlotRandomness::fresh();
    let mut after: Vec<String> = Vec::new();
    let mut written: Vec<PathBuf> = Vec::new();
    let (kind_name, fields, kek) = match new {
        NewSlot::Passphrase => {
            let params = args.kdf.resolve(None)?;
            let pass = read_passphrase_from(
                args.new_passfile.as_deref(),
                args.new_extpass.as_deref(),
                "New passphrase: ",
                Confirm::Twice,
            )?;
            let (f, k) = slots::passphrase::new_slot(&pass, params, &rnd.salt)?;
            (kind::PASSPHRASE, f, k)
        }
        NewSlot::Keyfile(data) => {
            let (f, k) = slots::keyfile::new_slot(&data, &rnd.salt)?;
            (kind::KEYFILE, f, k)
        }
        NewSlot::Recipient(r) => {
            let sharing = config.params.file_keys == FileKeys::Wrapped;
            let (f, k) = slots::recipient::new_slot(&r, sharing)?;
            (kind::RECIPIENT, f, k)
        }
        NewSlot::Pkcs11 { module, token } => {
            let (f, k) =
                pkcs11::new_slot(&module, &token, args.pin_file.as_deref(), &volume_id, id)?;
            (kind::PKCS11, f, k)
        }
        NewSlot::Gpg(r) => {
            let sharing = config.params.file_keys == FileKeys::Wrapped;
            let (f, k) = gpg::new_slot(&r, sharing)?;
            (kind::GPG, f, k)
        }
        NewSlot::Shamir {
            m,
            n,
            dir,
            recipients,
        } => {
            let (f, k, shares) = slots::shamir::new_slot(volume_id, id, m, n)?;
            for sh in &shares {
                let encrypted = recipients.get(sh.index as usize - 1);
                let name = format!(
                    "cloakfs-slot{id}-share{}of{n}.txt{}",
                    sh.index,
                    if encrypted.is_some() { ".age" } else { "" }
                );
                let path = dir.join(name);
                let text = sh.file_text();
                let data = match encrypted {
                    Some(r) => zeroize::Zeroizing::new(slots::recipient::encrypt_armored(
                        r,
                        text.as_bytes(),
                    )?),
                    None => zeroize::Zeroizing::new(text.as_bytes().to_vec()),
                };
                if let Err(e) = write_private(&path, &data) {
                    for p in &written {
                        let _ = std::fs::remove_file(p);
                    }
                    return Err(e);
                }
                written.push(path);
            }
            if let Ok(d) = std::fs::File::open(&dir) {
                let _ = d.sync_all();
            }
            after.push(format!(
                "Wrote {n} share files (any {m} open the slot; give each to a different person):"
            ));
            after.extend(written.iter().map(|p| format!("  {}", p.display())));
            (kind::SHAMIR, f, k)
        }
        NewSlot::Recovery => {
            let key = RecoveryKey::generate();
            let (f, k) = slots::recovery::new_slot(&key, &rnd.salt);
            after.push(
                "Recovery key (shown only this once: write it down and keep it away from the \
                 volume):"
                    .into(),
            );
            after.push(String::new());
            after.push(format!("    {}", key.encode().as_str()));
            after.push(String::new());
            after.push(
                "To unlock with it, put it in a file and pass --recovery-key-file FILE.".into(),
            );
            (kind::RECOVERY, f, k)
        }
    };
    let result = (|| -> Result<u32> {
        let got = config.add_slot(mk, kind_name, &args.label, fields, &kek, rnd.nonce)?;
        config.seal(mk);
        config.save(&args.cipherdir)?;
        Ok(got)
    })();
    let got = match result {
        Ok(got) => got,
        Err(e) => {
            for p in &written {
                let _ = std::fs::remove_file(p);
            }
            return Err(e);
        }
    };
    debug_assert_eq!(got, id);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "Added key slot {got} ({kind_name}).");
    for l in after {
        let _ = writeln!(out, "{l}");
    }
    Ok(())
}

/// Writes a new file readable only by its owner, durably; refuses to overwrite.
fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            Failure::new(
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    code::USAGE
                } else {
                    code::OTHER
                },
                format!("cannot write share file {}: {e}", path.display()),
            )
        })?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .map_err(|e| Failure::other(format!("cannot write share file {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m_of_n() {
        assert_eq!(parse_m_of_n("2/3").unwrap(), (2, 3));
        assert!(parse_m_of_n("3/2").is_err());
        assert!(parse_m_of_n("0/2").is_err());
        assert!(parse_m_of_n("2").is_err());
        assert!(parse_m_of_n("a/b").is_err());
    }
}
