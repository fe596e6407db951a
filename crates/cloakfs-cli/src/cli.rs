//! Command-line definitions. The man pages and shell completions are generated from them
//! (`cloakfs man-pages`, `cloakfs completions`).

use clap::{Parser, Subcommand};

/// The version, with the on-disk format versions this build reads.
pub fn version_text() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        use cloakfs_core::{format, slots, tools};
        format!(
            "{} (reads volume format {}, config layout {}, file header {}, key share {}, \
             rekey journal {})",
            env!("CARGO_PKG_VERSION"),
            format::config::FORMAT_VERSION,
            format::config::CONFIG_VERSION,
            format::content::HEADER_VERSION,
            slots::shamir::SHARE_VERSION,
            tools::rekey::JOURNAL_VERSION
        )
    })
}

const OVERVIEW: &str = "\
Point cloakfs at a directory (the cipher directory, on any file system) and it mounts a \
plaintext view of it: only ciphertext, encrypted names and encrypted metadata reach the \
cipher directory. `cloakfs COMMAND --help` and cloakfs-COMMAND(1) tell each command's options; \
cloakfs(1) lists the exit codes.

Secrets come from a prompt without echo, a passfile (--passfile FILE, \"-\" for standard input), \
a program (--extpass CMD) or a key slot of another kind; never from a command-line argument. \
Every error is one line on standard error, prefixed cloakfs:.";

/// A transparent encrypting file system: a plaintext view of an encrypted directory.
#[derive(Debug, Parser)]
#[command(
    name = "cloakfs",
    version = version_text(),
    after_long_help = OVERVIEW
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a new volume in an empty (or missing) directory.
    Init(crate::commands::init::InitArgs),
    /// Unlock a volume and mount its plaintext view.
    Mount(crate::commands::mount::MountArgs),
    /// Mount a read-only, deterministic encrypted view of a plaintext directory (for
    /// backups; its copy mounts as an ordinary volume). Make its config with init --reverse.
    Reverse(crate::commands::reverse::ReverseArgs),
    /// Run a command with the plaintext view that only it and its children see.
    Run(crate::commands::run::RunArgs),
    /// Encrypt plaintext entries of an adopted tree in place, through its mount (resumable);
    /// `-r` of the whole mount then has the tree recorded as converted.
    Encrypt(crate::commands::encrypt::EncryptArgs),
    /// Unmount a plaintext view (flushes everything first).
    #[command(alias = "umount")]
    Unmount(crate::commands::unmount::UnmountArgs),
    /// Show a volume's format, ciphers and key slots (no secret needed).
    Info(crate::commands::info::InfoArgs),
    /// The volumes this machine has opened and their key fingerprints (key pinning).
    #[command(subcommand)]
    Known(crate::commands::known::KnownCommand),
    /// Change a passphrase (re-wraps the master key; no file is rewritten).
    Passwd(crate::commands::passwd::PasswdArgs),
    /// List, add or remove key slots.
    #[command(subcommand)]
    Slots(crate::commands::slots::SlotsCommand),
    /// Make ~/.Private.enc (opened with your login password) and ~/Private for pam_cloakfs.
    SetupPrivate(crate::commands::setup_private::SetupPrivateArgs),
    /// Share single files of a sharing volume with public keys (add, remove, list, export).
    #[command(subcommand)]
    Share(crate::commands::share::ShareCommand),
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
    /// Bring a volume made by an older cloakfs to the current format (offline).
    Upgrade(crate::commands::upgrade::UpgradeArgs),
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
    /// Print the completion script for SHELL (bash, zsh, fish, elvish, powershell).
    Completions(crate::commands::docs::CompletionsArgs),
    /// Write the man pages (cloakfs.1, cloakfs-mount.1, ...) into a directory.
    ManPages(crate::commands::docs::ManPagesArgs),
}
