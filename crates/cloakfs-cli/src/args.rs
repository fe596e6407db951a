//! Argument groups that several commands share: how to unlock a volume, where a new
//! passphrase comes from, and whom a mount serves.

use clap::Args;
use std::path::PathBuf;

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
    /// Unlock a gpg slot with `gpg --decrypt` (your gpg-agent supplies the key); on a sharing
    /// volume, also open the files granted to your gpg key (attach: the daemon runs gpg as you,
    /// with your GNUPGHOME).
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

/// Whom a mount serves (key binding, Cryptfs): `--bind user|session`, `-o bind=user|session`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BindTo {
    /// Only the user who mounts: requests of every other uid, root included, get EACCES.
    User,
    /// Only that user's processes in the Unix session that mounts (see `ps -o sid`).
    Session,
}

impl BindTo {
    /// The binding of a mount made by this process now.
    pub fn binding(self) -> crate::failure::Result<cloakfs_fuse::Binding> {
        match self {
            BindTo::User => Ok(cloakfs_fuse::Binding::this_user()),
            BindTo::Session => cloakfs_fuse::Binding::this_session().map_err(|e| {
                crate::failure::Failure::other(format!("cannot read the session ID: {e}"))
            }),
        }
    }
}
