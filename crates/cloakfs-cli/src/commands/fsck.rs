//! `cloakfs fsck`: check every config field, directory ID, name, long-name file, header, block
//! tag, symlink target and xattr of a volume, without mounting; `--repair` fixes what is safely
//! fixable. The checking itself is `cloakfs_core::tools::fsck`.

use crate::args::UnlockArgs;
use crate::failure::{code, Failure, Result};
use cloakfs_core::tools::fsck::{self, Options, Report};
use cloakfs_core::tools::walk::Progress;
use cloakfs_core::tools::{mounts, rekey};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, clap::Args)]
pub struct FsckArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// Print the report as JSON on standard output (counts and an array of problems).
    #[arg(long)]
    pub json: bool,
    /// Fix what is safely fixable: orphaned long-name sidecars, stray temporary files, a
    /// missing directory ID of an empty directory. Never touches user data.
    #[arg(long)]
    pub repair: bool,
    /// The volume's cipher directory.
    pub cipherdir: PathBuf,
}

pub fn run(args: FsckArgs) -> Result<()> {
    let cipherdir = &args.cipherdir;
    rekey::check_not_rekeying(cipherdir)?;
    let _lock = if args.repair {
        mounts::check_not_mounted(cipherdir)?;
        Some(rekey::lock_volume(cipherdir)?)
    } else {
        if let Ok(Some(m)) = mounts::mounted_at(cipherdir) {
            eprintln!(
                "cloakfs: note: the volume is mounted on {}; writes in progress may show as problems",
                m.display()
            );
        }
        None
    };
    let volume = crate::unlock::unlock(&args.unlock, cipherdir)?;
    let bar = Bar::new("checking");
    let report = fsck::check(
        &volume,
        cipherdir,
        Options {
            repair: args.repair,
        },
        &bar,
    )?;
    bar.finish();
    if args.json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::other(format!("cannot write the report: {e}")))?;
        println!("{json}");
    } else {
        print_text(&report, args.repair);
    }
    let c = &report.counts;
    let left = report.unrepaired();
    if report.clean {
        Ok(())
    } else if left == 0 {
        Err(Failure::new(
            code::REPAIRED,
            format!(
                "repaired {}; the volume is clean now",
                if c.problems == 1 {
                    "the problem".to_string()
                } else {
                    format!("all {} problems", c.problems)
                }
            ),
        ))
    } else {
        let fixable = report
            .problems
            .iter()
            .filter(|p| p.repairable && !p.repaired)
            .count();
        let hint = if fixable > 0 && !args.repair {
            format!(" ({fixable} repairable with --repair)")
        } else {
            String::new()
        };
        Err(Failure::new(
            code::PROBLEMS,
            format!("{} found{hint}", counted(left as u64, "problem")),
        ))
    }
}

/// `n` things, in the singular when `n` is 1 ("1 problem", "3 problems").
fn counted(n: u64, thing: &str) -> String {
    match (n, thing) {
        (1, _) => format!("1 {thing}"),
        (_, "directory") => format!("{n} directories"),
        _ => format!("{n} {thing}s"),
    }
}

fn print_text(report: &Report, repair: bool) {
    for p in &report.problems {
        let state = if p.repaired {
            " [repaired]"
        } else if p.repairable && !repair {
            " [repairable with --repair]"
        } else if p.repairable {
            " [not repaired]"
        } else {
            ""
        };
        let kind = serde_json::to_value(p.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        println!("{}: {kind}: {}{state}", p.location(), p.detail);
        println!("    backing: {}", p.backing.display());
    }
    for p in &report.plaintext {
        println!(
            "{}: still plaintext (cloakfs encrypt on the mount)",
            cloakfs_core::tools::walk::display_plain(p)
        );
    }
    if !report.plaintext.is_empty() {
        println!(
            "{} of the adopted tree not yet encrypted",
            counted(report.plaintext.len() as u64, "plaintext file")
        );
    }
    let c = &report.counts;
    if let Some(why) = &report.contents_unchecked {
        println!("file contents cannot be checked: {why}");
    }
    println!(
        "checked {}, {} ({} bytes in {}), {}, {} other, {}, config with {}: {}",
        counted(c.directories, "directory"),
        counted(c.files, "file"),
        c.plain_bytes,
        counted(c.blocks, "block"),
        counted(c.symlinks, "symlink"),
        c.other,
        counted(c.xattrs, "xattr"),
        counted(c.slots, "key slot"),
        if report.clean {
            "no problems".to_string()
        } else {
            format!(
                "{}, {} repaired",
                counted(c.problems, "problem"),
                c.repaired
            )
        }
    );
    if let Some(sh) = &report.sharing {
        for p in &sh.no_member_can_open {
            println!("{p}: no member of the volume can open it");
        }
        for (p, key) in &sh.unknown_keys {
            println!("{p}: shared with {key}, a key no slot holds");
        }
        for (dir, keys) in &sh.defaults {
            println!(
                "{dir}: new files made in it are granted by default to {}",
                keys.join(", ")
            );
        }
        if !sh.slots_without_keys.is_empty() {
            let ids: Vec<String> = sh.slots_without_keys.iter().map(u32::to_string).collect();
            println!(
                "recipient slots {} keep no public keys (made by an earlier cloakfs): their \
                 members' keys count as keys no slot holds",
                ids.join(", ")
            );
        }
    }
    if c.not_shared > 0 {
        println!(
            "{} not shared with the identity given (their contents were not checked: \
             run fsck with --identity of a member they are shared with)",
            if c.not_shared == 1 {
                "1 file is".to_string()
            } else {
                format!("{} files are", c.not_shared)
            }
        );
    }
}

/// Set by SIGINT/SIGTERM while a long offline operation runs (see [`Bar::catch_signals`]).
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    if STOP.swap(true, Ordering::SeqCst) {
        // Second signal: stop now. Every step is atomic, so this is safe too.
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
}

/// A progress bar on standard error (only when it is a terminal), shared by fsck, export and
/// rekey; it also carries the "stop requested" flag.
pub struct Bar(Option<indicatif::ProgressBar>);

impl Bar {
    pub fn new(what: &str) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self(None);
        }
        // Hidden until `start` knows the total: a first frame of "0 B/0 B" says nothing.
        let pb = indicatif::ProgressBar::with_draw_target(
            Some(0),
            indicatif::ProgressDrawTarget::hidden(),
        );
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb.set_message(what.to_string());
        Self(Some(pb))
    }

    /// From now on SIGINT and SIGTERM only ask the operation to stop between two atomic steps
    /// (a second signal ends the process at once).
    pub fn catch_signals(&self) {
        let h: extern "C" fn(libc::c_int) = on_signal;
        // SAFETY: the handler only touches an atomic and calls _exit, both async-signal-safe.
        unsafe {
            libc::signal(libc::SIGINT, h as libc::sighandler_t);
            libc::signal(libc::SIGTERM, h as libc::sighandler_t);
        }
    }

    pub fn stopped(&self) -> bool {
        STOP.load(Ordering::SeqCst)
    }

    pub fn finish(&self) {
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}

impl Progress for Bar {
    fn start(&self, bytes: u64, _entries: u64) {
        if let Some(pb) = &self.0 {
            pb.set_length(bytes.max(1));
            pb.set_position(0);
            pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
    }

    fn advance(&self, bytes: u64, _entries: u64) {
        if let Some(pb) = &self.0 {
            pb.inc(bytes);
        }
    }

    fn phase(&self, what: &str) {
        if let Some(pb) = &self.0 {
            pb.set_message(what.to_string());
        }
    }

    fn cancelled(&self) -> bool {
        self.stopped()
    }
}
