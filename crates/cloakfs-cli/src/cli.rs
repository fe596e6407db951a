//! Command-line definitions.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// A transparent encrypting file system: a plaintext view of an encrypted directory.
#[derive(Debug, Parser)]
#[command(name = "cloakfs", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a new volume in an empty (or missing) directory.
    Init(InitArgs),
    /// Unlock a volume and mount its plaintext view.
    Mount(MountArgs),
    /// Unmount a plaintext view (flushes everything first).
    #[command(alias = "umount")]
    Unmount(UnmountArgs),
    /// Show a volume's format, ciphers and key slots (no secret needed).
    Info(InfoArgs),
    /// Change a passphrase (re-wraps the master key; no file is rewritten).
    Passwd(crate::commands::passwd::PasswdArgs),
    /// List, add or remove key slots.
    #[command(subcommand)]
    Slots(crate::commands::slots::SlotsCommand),
    /// Decrypt one file to standard output, without mounting.
    Cat(crate::commands::cat::CatArgs),
    /// Translate names between plaintext and cipher directory, without mounting.
    Name(crate::commands::name::NameArgs),
    /// Check every config field, header, block, name and long-name file of a volume.
    Fsck(crate::commands::fsck::FsckArgs),
    /// Copy the whole plaintext tree out of a volume, without mounting.
    Export(crate::commands::export::ExportArgs),
    /// Move the volume to a fresh master key, re-encrypting every file and name.
    Rekey(crate::commands::rekey::RekeyArgs),
    /// Run the multi-user daemon (root): one tree of attaches and a control socket.
    Daemon(crate::commands::serve::DaemonArgs),
    /// Add a volume to the daemon's tree (e.g. /crypt/NAME), unlocked here.
    Attach(crate::commands::attach::AttachArgs),
    /// Remove an attach from the tree and wipe its keys.
    Detach(crate::commands::attach::DetachArgs),
    /// List your attaches and sessions.
    Status(crate::commands::attach::StatusArgs),
    /// Add, list or delete authorizations of an attach.
    #[command(subcommand)]
    Authz(crate::commands::authz::AuthzCommand),
    /// Authenticate to an attach and open an active session.
    Auth(crate::commands::authz::AuthArgs),
    /// List an attach's sessions.
    Sessions(crate::commands::authz::SessionsArgs),
    /// End a session for good.
    Revoke(crate::commands::authz::RevokeArgs),
}

/// How to unlock a volume: which secret, from where (default: passphrase prompt).
///
/// Every command that needs the master key flattens this and calls [`crate::unlock::unlock`].
/// Several secrets may be given at once; each key slot is tried with the secret of its kind.
#[derive(Debug, Args, Default, Clone)]
pub struct UnlockArgs {
    /// Read the passphrase from the first line of FILE ("-" for standard input).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "extpass",
        help_heading = "Unlocking"
    )]
    pub passfile: Option<PathBuf>,
    /// Run CMD with /bin/sh and use the first line it prints as the passphrase.
    #[arg(long, value_name = "CMD", help_heading = "Unlocking")]
    pub extpass: Option<String>,
    /// Unlock with a key file (all its bytes; "-" for standard input).
    #[arg(long, value_name = "FILE", help_heading = "Unlocking")]
    pub keyfile: Option<PathBuf>,
    /// Unlock a recipient slot with an age identity file or an ssh private key (repeatable).
    #[arg(long, value_name = "FILE", help_heading = "Unlocking")]
    pub identity: Vec<PathBuf>,
    /// Unlock a PKCS#11 slot with this module (e.g. /usr/lib/softhsm/libsofthsm2.so).
    #[arg(long, value_name = "SO", help_heading = "Unlocking")]
    pub pkcs11_module: Option<PathBuf>,
    /// Label of the PKCS#11 token (default: the token the slot was made on).
    #[arg(
        long,
        value_name = "LABEL",
        requires = "pkcs11_module",
        help_heading = "Unlocking"
    )]
    pub pkcs11_token: Option<String>,
    /// Read the token's user PIN from the first line of FILE (default: prompt without echo).
    #[arg(
        long,
        value_name = "FILE",
        requires = "pkcs11_module",
        help_heading = "Unlocking"
    )]
    pub pin_file: Option<PathBuf>,
    /// Unlock a gpg slot with `gpg --decrypt` (your gpg-agent supplies the key).
    #[arg(long, help_heading = "Unlocking")]
    pub gpg: bool,
    /// A Shamir share file (repeat until the slot's threshold is reached).
    #[arg(long, value_name = "FILE", help_heading = "Unlocking")]
    pub share: Vec<PathBuf>,
    /// Read a recovery key from FILE ("-" for standard input).
    #[arg(long, value_name = "FILE", help_heading = "Unlocking")]
    pub recovery_key_file: Option<PathBuf>,
    /// Try only the key slot with this ID.
    #[arg(long, value_name = "ID", help_heading = "Unlocking")]
    pub slot: Option<u32>,
}

impl UnlockArgs {
    /// Whether any secret source other than the passphrase was given.
    pub fn has_other_secret(&self) -> bool {
        self.keyfile.is_some()
            || !self.identity.is_empty()
            || self.pkcs11_module.is_some()
            || self.gpg
            || !self.share.is_empty()
            || self.recovery_key_file.is_some()
    }
}

/// Where a new passphrase comes from (default: prompt twice without echo).
#[derive(Debug, Args, Default, Clone)]
pub struct NewPassArgs {
    /// Read the passphrase from the first line of FILE ("-" for standard input).
    #[arg(long, value_name = "FILE", conflicts_with = "extpass")]
    pub passfile: Option<PathBuf>,
    /// Run CMD with /bin/sh and use the first line it prints as the passphrase.
    #[arg(long, value_name = "CMD")]
    pub extpass: Option<String>,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Where the new passphrase comes from (default: prompt twice).
    #[command(flatten)]
    pub secret: NewPassArgs,
    /// No stored master key: derive it from the passphrase alone (Cryptfs/CFS style). The
    /// passphrase can then never be changed and no other key slot can be added.
    #[arg(long)]
    pub no_stored_key: bool,
    /// Content cipher.
    #[arg(long, default_value = "aes-256-gcm", value_parser = ["aes-256-gcm", "xchacha20-poly1305"])]
    pub cipher: String,
    /// Treat all-zero blocks as tampering instead of holes (sparse files then take space).
    #[arg(long)]
    pub strict_holes: bool,
    /// Longest encrypted name stored as is (62..255); shorten for cloud storage limits.
    #[arg(long, default_value_t = 255, value_name = "N")]
    pub long_name_max: usize,
    /// Target time for one Argon2id derivation, in milliseconds (calibrated here).
    #[arg(long, default_value_t = 500, value_name = "MS")]
    pub kdf_time: u64,
    /// Argon2id memory in KiB (skips calibration; default 65536 when iterations are given).
    #[arg(long, value_name = "KIB")]
    pub kdf_memory: Option<u32>,
    /// Argon2id iterations (skips calibration).
    #[arg(long, value_name = "N")]
    pub kdf_iterations: Option<u32>,
    /// The directory that will hold the ciphertext.
    pub cipherdir: PathBuf,
}

#[derive(Debug, Args)]
pub struct MountArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// Stay in the foreground (log to standard error) instead of daemonizing.
    #[arg(short, long)]
    pub foreground: bool,
    /// Mount options, comma separated (ro, allow_other, noexec, passfile=F, ...); repeatable.
    #[arg(short = 'o', value_name = "OPTIONS", action = clap::ArgAction::Append)]
    pub options: Vec<String>,
    /// Worker threads serving the file system.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Seconds the kernel may cache attributes and names [default: 30]. Changes made to the
    /// cipher directory by anything but this mount show up after at most this long: use 1
    /// if another machine or a sync client writes to it while it is mounted.
    #[arg(long, value_name = "SECS")]
    pub cache_timeout: Option<f64>,
    /// Append the daemon's log to FILE (default: syslog when daemonized).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// The volume's cipher directory.
    pub cipherdir: PathBuf,
    /// Where the plaintext view appears.
    pub mountpoint: PathBuf,
}

#[derive(Debug, Args)]
pub struct UnmountArgs {
    /// Detach now even if busy; the file system goes away when no longer used.
    #[arg(short = 'z', long)]
    pub lazy: bool,
    /// The mount point.
    pub mountpoint: PathBuf,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The volume's cipher directory (or its config file).
    pub cipherdir: PathBuf,
}
