//! The `cloakfs` command: wires the core library and the FUSE front end together.

mod args;
mod cli;
mod commands;
mod control;
mod daemon;
mod failure;
mod holders;
mod logging;
mod mount_options;
mod secret_input;
mod signals;
mod unlock;

use clap::Parser;
use cli::{Cli, Command};
use std::ffi::OsString;
use std::process::ExitCode;

/// Whether WORD names a command (or an alias, or `help`), as the clap definition says.
fn is_command(word: &str) -> bool {
    use clap::CommandFactory;
    word == "help"
        || Cli::command()
            .get_subcommands()
            .any(|c| c.get_name() == word || c.get_all_aliases().any(|a| a == word))
}

/// mount(8) runs `mount.fuse.cloakfs CIPHERDIR MOUNTPOINT [-sfnv] [-o OPTS] [-t fuse.cloakfs]`
/// (the package links that name to cloakfs) and mount.fuse3 runs `cloakfs CIPHERDIR
/// MOUNTPOINT -o OPTS`: both mean `cloakfs mount ...`. Of mount(8)'s helper flags, -s
/// (sloppy), -n (no mtab), -v (verbose) and -t (the type) change nothing for cloakfs; -f
/// (fake) is refused.
fn normalize_args(mut args: Vec<OsString>) -> Result<Vec<OsString>, failure::Failure> {
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
        .is_some_and(|f| !f.starts_with('-') && !is_command(f));
    if as_mount_helper {
        args = helper_args(args)?;
    }
    if as_mount_helper || is_path_like {
        args.insert(1, "mount".into());
    }
    Ok(args)
}

/// The arguments of a mount(8) helper run, without the flags that mean nothing to cloakfs.
fn helper_args(args: Vec<OsString>) -> Result<Vec<OsString>, failure::Failure> {
    let mut kept = Vec::with_capacity(args.len());
    let mut it = args.into_iter();
    kept.extend(it.next());
    while let Some(arg) = it.next() {
        let text = arg.to_string_lossy();
        if text == "-t" || text == "-N" {
            it.next();
        } else if text.starts_with("-t") || text.starts_with("-N") {
        } else if text.len() > 1
            && text.starts_with('-')
            && !text.starts_with("--")
            && text[1..].chars().all(|c| "sfnv".contains(c))
        {
            if text.contains('f') {
                return Err(failure::Failure::usage(
                    "mount -f (fake) is not supported: cloakfs mounts for real or not at all",
                ));
            }
        } else {
            kept.push(arg);
        }
    }
    Ok(kept)
}

fn main() -> ExitCode {
    daemon::ensure_std_streams();
    logging::init();
    let args = match normalize_args(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(f) => {
            eprintln!("cloakfs: {f}");
            return ExitCode::from(f.code);
        }
    };
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
        Command::Run(a) => match commands::run::run(a) {
            Ok(status) => return ExitCode::from(status),
            Err(f) => Err(f),
        },
        Command::Unmount(a) => commands::unmount::run(a),
        Command::Encrypt(a) => commands::encrypt::run(a),
        Command::Info(a) => commands::info::run(a),
        Command::Known(a) => commands::known::run(a),
        Command::Passwd(a) => commands::passwd::run(a),
        Command::SetupPrivate(a) => commands::setup_private::run(a),
        Command::Slots(a) => commands::slots::run(a),
        Command::Share(a) => commands::share::run(a),
        Command::Cat(a) => commands::cat::run(a),
        Command::Name(a) => commands::name::run(a),
        Command::Fsck(a) => commands::fsck::run(a),
        Command::Export(a) => commands::export::run(a),
        Command::Rekey(a) => commands::rekey::run(a),
        Command::Upgrade(a) => commands::upgrade::run(a),
        Command::Daemon(a) => commands::serve::run(a),
        Command::Attach(a) => commands::attach::run_attach(a),
        Command::Detach(a) => commands::attach::run_detach(a),
        Command::Status(a) => commands::attach::run_status(a),
        Command::Authz(a) => commands::authz::run(a),
        Command::Auth(a) => commands::authz::run_auth(a),
        Command::Sessions(a) => commands::authz::run_sessions(a),
        Command::Revoke(a) => commands::authz::run_revoke(a),
        Command::Completions(a) => commands::docs::run_completions(a),
        Command::ManPages(a) => commands::docs::run_man_pages(a),
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
        | Command::Run(_)
        | Command::SetupPrivate(_)
        | Command::Passwd(_)
        | Command::Slots(_)
        | Command::Share(_)
        | Command::Cat(_)
        | Command::Name(_)
        | Command::Fsck(_)
        | Command::Export(_)
        | Command::Rekey(_)
        | Command::Upgrade(_)
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
        | Command::Revoke(_)
        | Command::Completions(_)
        | Command::ManPages(_) => false,
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
            normalize_args(v(&["cloakfs", "/c", "/m", "-o", "ro"])).unwrap(),
            v(&["cloakfs", "mount", "/c", "/m", "-o", "ro"])
        );
        assert_eq!(
            normalize_args(v(&["/sbin/mount.cloakfs", "/c", "/m"])).unwrap(),
            v(&["/sbin/mount.cloakfs", "mount", "/c", "/m"])
        );
        assert_eq!(
            normalize_args(v(&["cloakfs", "init", "/c"])).unwrap(),
            v(&["cloakfs", "init", "/c"])
        );
        for cmd in [
            "umount",
            "completions",
            "man-pages",
            "help",
            "setup-private",
        ] {
            assert_eq!(
                normalize_args(v(&["cloakfs", cmd, "x"])).unwrap(),
                v(&["cloakfs", cmd, "x"])
            );
        }
        assert_eq!(
            normalize_args(v(&["cloakfs", "--help"])).unwrap(),
            v(&["cloakfs", "--help"])
        );
    }

    #[test]
    fn mount_helper_flags_of_mount8() {
        assert_eq!(
            normalize_args(v(&[
                "/sbin/mount.fuse.cloakfs",
                "/c",
                "/m",
                "-sn",
                "-v",
                "-o",
                "rw,passfile=/p",
                "-t",
                "fuse.cloakfs",
            ]))
            .unwrap(),
            v(&[
                "/sbin/mount.fuse.cloakfs",
                "mount",
                "/c",
                "/m",
                "-o",
                "rw,passfile=/p"
            ])
        );
        let fake = normalize_args(v(&["mount.cloakfs", "/c", "/m", "-fv"])).unwrap_err();
        assert_eq!(fake.code, failure::code::USAGE);
        // Outside the helper form, -f is --foreground.
        assert_eq!(
            normalize_args(v(&["cloakfs", "/c", "/m", "-f"])).unwrap(),
            v(&["cloakfs", "mount", "/c", "/m", "-f"])
        );
    }
}
