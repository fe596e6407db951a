//! Who keeps a mount busy: the processes whose current or root directory, open files or
//! mapped files lie under it, and the file systems mounted inside it, as /proc shows them.

use std::path::{Path, PathBuf};

/// One reason a mount is busy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// A process, by its ID and command name, and what it holds there.
    Process {
        pid: u32,
        comm: String,
        what: String,
    },
    /// A file system mounted inside it.
    Mount(PathBuf),
}

/// Everything this process may see holding `mnt` (a canonical mount point). Processes of
/// other users are only seen by root.
pub fn of(mnt: &Path) -> Vec<Holder> {
    let mut found = Vec::new();
    let under = |p: &Path| p.starts_with(mnt);
    if let Ok(mounts) = cloakfs_core::tools::mounts::current() {
        found.extend(
            mounts
                .into_iter()
                .filter(|m| m.point != mnt && under(&m.point))
                .map(|m| Holder::Mount(m.point)),
        );
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    let me = std::process::id();
    for pid in procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        if pid == me {
            continue;
        }
        let dir = PathBuf::from(format!("/proc/{pid}"));
        let link = |name: &str| std::fs::read_link(dir.join(name)).ok().filter(|p| under(p));
        let what = if let Some(p) = link("cwd") {
            Some(format!("its current directory {}", p.display()))
        } else if let Some(p) = link("root") {
            Some(format!("its root directory {}", p.display()))
        } else if let Some(p) = open_file_under(&dir, mnt) {
            Some(format!("an open file {}", p.display()))
        } else {
            mapped_file_under(&dir, mnt).map(|p| format!("a mapped file {}", p.display()))
        };
        if let Some(what) = what {
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            found.push(Holder::Process {
                pid,
                comm: comm.trim().to_string(),
                what,
            });
        }
    }
    found
}

fn open_file_under(proc_dir: &Path, mnt: &Path) -> Option<PathBuf> {
    std::fs::read_dir(proc_dir.join("fd"))
        .ok()?
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .find(|p| p.starts_with(mnt))
}

fn mapped_file_under(proc_dir: &Path, mnt: &Path) -> Option<PathBuf> {
    let maps = std::fs::read_to_string(proc_dir.join("maps")).ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(PathBuf::from)
        .find(|p| p.starts_with(mnt))
}

/// The holders in one line: at most five, then how many more.
pub fn describe(holders: &[Holder]) -> String {
    let mut parts: Vec<String> = holders
        .iter()
        .take(5)
        .map(|h| match h {
            Holder::Process { pid, comm, what } => format!("process {pid} ({comm}) has {what}"),
            Holder::Mount(p) => format!("{} is mounted inside it", p.display()),
        })
        .collect();
    if holders.len() > 5 {
        parts.push(format!("and {} more", holders.len() - 5));
    }
    parts.join("; ")
}
