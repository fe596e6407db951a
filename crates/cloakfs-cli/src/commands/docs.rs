//! `cloakfs completions SHELL` and `cloakfs man-pages DIR`: shell completions and man pages,
//! generated from the command-line definition (the Debian package ships both).

use crate::cli::Cli;
use crate::failure::{code, Failure, Result};
use clap::{Args, CommandFactory};
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManPagesArgs {
    /// Where to write cloakfs.1 and one page per command, e.g. cloakfs-mount.1 (made if
    /// missing).
    pub dir: PathBuf,
}

pub fn run_completions(args: CompletionsArgs) -> Result<()> {
    let mut cmd = Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "cloakfs", &mut std::io::stdout());
    Ok(())
}

pub fn run_man_pages(args: ManPagesArgs) -> Result<()> {
    let fail = |e: std::io::Error| {
        Failure::other(format!("writing man pages to {}: {e}", args.dir.display()))
    };
    std::fs::create_dir_all(&args.dir).map_err(fail)?;
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    write_pages(&cmd, &args.dir, true).map_err(fail)
}

/// Writes the page of CMD and of each of its visible subcommands (cloakfs-slots-add.1, ...).
fn write_pages(cmd: &clap::Command, dir: &Path, top: bool) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, false)?;
    }
    let man = Man::new(cmd.clone())
        .source(format!("cloakfs {}", env!("CARGO_PKG_VERSION")))
        .manual("cloakfs manual");
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    if !top {
        // cloakfs(1) has a longer description below.
        man.render_description_section(&mut page)?;
    }
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut page)?;
    }
    if cmd.has_subcommands() {
        man.render_subcommands_section(&mut page)?;
    }
    let mut roff = Roff::default();
    if let Some(notes) = cmd.get_after_long_help() {
        section(&mut roff, if top { "DESCRIPTION" } else { "NOTES" });
        paragraphs(&mut roff, &notes.to_string());
    }
    if top {
        top_sections(&mut roff);
    } else {
        section(&mut roff, "SEE ALSO");
        roff.text([roman("cloakfs(1)")]);
    }
    roff.to_writer(&mut page)?;
    std::fs::write(dir.join(man.get_filename()), page)
}

fn section(roff: &mut Roff, title: &str) {
    roff.control("SH", [title]);
}

fn paragraphs(roff: &mut Roff, text: &str) {
    for para in text.split("\n\n") {
        roff.control("PP", []);
        roff.text([roman(para)]);
    }
}

/// A tagged list: each item's tag in bold, its text indented below.
fn tagged(roff: &mut Roff, items: &[(&str, &str)]) {
    for (tag, text) in items {
        roff.control("TP", []);
        roff.text([bold(*tag)]);
        roff.text([roman(*text)]);
    }
}

/// The sections only cloakfs(1) has: exit status, files, environment, see also.
fn top_sections(roff: &mut Roff) {
    section(roff, "EXIT STATUS");
    let codes: Vec<(String, &str)> = code::MEANINGS
        .iter()
        .map(|(c, m)| (c.to_string(), *m))
        .collect();
    let codes: Vec<(&str, &str)> = codes.iter().map(|(c, m)| (c.as_str(), *m)).collect();
    tagged(roff, &codes);
    section(roff, "FILES");
    tagged(
        roff,
        &[
            (
                "~/.local/state/cloakfs/known_volumes.json",
                "The volumes this user has opened on this machine and their master-key \
                 fingerprints (key pinning; see cloakfs-known(1)). $XDG_STATE_HOME/cloakfs if \
                 set; /var/lib/cloakfs for root.",
            ),
            (
                "/etc/security/cloakfs.conf",
                "The volumes pam_cloakfs.so mounts at login: one line per user, @group or *: \
                 CIPHERDIR MOUNTPOINT [OPTIONS], ~ and %u expanded (see cloakfs-setup-private(1)).",
            ),
            (
                "/usr/share/pam-configs/cloakfs",
                "The pam-auth-update profile that turns pam_cloakfs.so on (off until enabled).",
            ),
        ],
    );
    section(roff, "ENVIRONMENT");
    tagged(
        roff,
        &[
            (
                "CLOAKFS_STATE_DIR",
                "Where the key-pinning record lives instead of the default above.",
            ),
            (
                "CLOAKFS_LOG, RUST_LOG",
                "Log filter of the mount daemon (e.g. debug); no key or plaintext name is ever \
                 logged.",
            ),
        ],
    );
    section(roff, "SEE ALSO");
    roff.text([roman(
        "cloakfs-init(1), cloakfs-mount(1), cloakfs-run(1), cloakfs-setup-private(1), \
         cloakfs-known(1), mount.fuse3(8), fusermount3(1), pam-auth-update(8)",
    )]);
}
