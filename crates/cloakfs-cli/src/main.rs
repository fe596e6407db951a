//! The `cloakfs` command: wires the core library and the FUSE front end together.

mod args;
mod cli;
mod commands;
mod control;
mod daemon;
mod failure;
mod logging;
mod mount_options;
mod secret_input;
mod signals;
mod unlock;

use clap::Parser;
use cli::{Cli, Command};
use std::ffi::OsString;
use std::process::ExitCode;

const SUBCOMMANDS: &[&str] = &[
    "init", "mount", "reverse", "unmount", "encrypt", "umount", "info", "known", "passwd", "slots",
    "cat", "name", "fsck", "export", "rekey", "daemon", "attach", "detach", "status", "authz",
    "auth", "sessions", "revoke", "help",
];

/// mount(8) runs `mount.cloakfs CIPHERDIR MOUNTPOINT -o OPTS` and mount.fuse3 runs
/// `cloakfs CIPHERDIR MOUNTPOINT -o OPTS`: both mean `cloakfs mount ...`.
fn normalize_args(mut args: Vec<OsString>) -> Vec<OsString> {
    let prog = args
        .first()
        .and_then(|a| {
            std::path::Path::new(a)
                .file_name()
                .map(|n| n.to_os_string())
        })
        .unwrap_or_default();
    let as_mount_helper = prog.to_string_lossy().starts_with("mount.");
    let first = args.get(1).map(|a| a.to_string_lossy().into_owned());
    let is_path_like = first
        .as_deref()
        .is_some_and(|f| !f.starts_with('-') && !SUBCOMMANDS.contains(&f));
    if as_mount_helper || is_path_like {
        args.insert(1, "mount".into());
    }
    args
}

fn main() -> ExitCode {
    daemon::ensure_std_streams();
    logging::init();
    let args = normalize_args(std::env::args_os().collect());
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                failure::code::USAGE
            } else {
                0
            });
        }
    };
    if reads_secret(&cli.command) {
        cloakfs_core::crypto::secret::harden_process();
    }
    let result = match cli.command {
        Command::Init(a) => commands::init::run(a),
        Command::Mount(a) => commands::mount::run(a),
        Command::Reverse(a) => commands::reverse::run(a),
        Command::Unmount(a) => commands::unmount::run(a),
        Command::Encrypt(a) => commands::encrypt::run(a),
        Command::Info(a) => commands::info::run(a),
        Command::Known(a) => commands::known::run(a),
        Command::Passwd(a) => commands::passwd::run(a),
        Command::Slots(a) => commands::slots::run(a),
        Command::Cat(a) => commands::cat::run(a),
        Command::Name(a) => commands::name::run(a),
        Command::Fsck(a) => commands::fsck::run(a),
        Command::Export(a) => commands::export::run(a),
        Command::Rekey(a) => commands::rekey::run(a),
        Command::Daemon(a) => commands::serve::run(a),
        Command::Attach(a) => commands::attach::run_attach(a),
        Command::Detach(a) => commands::attach::run_detach(a),
        Command::Status(a) => commands::attach::run_status(a),
        Command::Authz(a) => commands::authz::run(a),
        Command::Auth(a) => commands::authz::run_auth(a),
        Command::Sessions(a) => commands::authz::run_sessions(a),
        Command::Revoke(a) => commands::authz::run_revoke(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("cloakfs: {f}");
            ExitCode::from(f.code)
        }
    }
}

/// Whether a command reads a secret or holds a key: such a command runs hardened (no core
/// dump, not dumpable) from its start, before it reads anything. Deliberately no `_` arm, so
/// a new command must be sorted here.
fn reads_secret(command: &Command) -> bool {
    match command {
        Command::Init(_)
        | Command::Mount(_)
        | Command::Reverse(_)
        | Command::Passwd(_)
        | Command::Slots(_)
        | Command::Cat(_)
        | Command::Name(_)
        | Command::Fsck(_)
        | Command::Export(_)
        | Command::Rekey(_)
        | Command::Daemon(_)
        | Command::Attach(_)
        | Command::Authz(_)
        | Command::Auth(_)
        | Command::Known(commands::known::KnownCommand::Accept(_)) => true,
        Command::Known(_)
        | Command::Unmount(_)
        | Command::Encrypt(_)
        | Command::Info(_)
        | Command::Detach(_)
        | Command::Status(_)
        | Command::Sessions(_)
        | Command::Revoke(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn mount_helper_forms() {
        assert_eq!(
            normalize_args(v(&["cloakfs", "/c", "/m", "-o", "ro"])),
            v(&["cloakfs", "mount", "/c", "/m", "-o", "ro"])
        );
        assert_eq!(
            normalize_args(v(&["/sbin/mount.cloakfs", "/c", "/m"])),
            v(&["/sbin/mount.cloakfs", "mount", "/c", "/m"])
        );
        assert_eq!(
            normalize_args(v(&["cloakfs", "init", "/c"])),
            v(&["cloakfs", "init", "/c"])
        );
        assert_eq!(
            normalize_args(v(&["cloakfs", "--help"])),
            v(&["cloakfs", "--help"])
        );
    }
}
