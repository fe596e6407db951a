//! Command-line definitions.

use clap::{Parser, Subcommand};

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
    Init(crate::commands::init::InitArgs),
    /// Unlock a volume and mount its plaintext view.
    Mount(crate::commands::mount::MountArgs),
    /// Mount a read-only, deterministic encrypted view of a plaintext directory (for
    /// backups; its copy mounts as an ordinary volume). Make its config with init --reverse.
    Reverse(crate::commands::reverse::ReverseArgs),
    /// Encrypt plaintext files of an adopted tree in place, through its mount (resumable).
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
