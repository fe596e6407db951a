//! Which login sessions share a mount made at login, so that the last one to close unmounts
//! it. One file per user in the run directory, changed under an exclusive lock:
//!
//! ```text
//! M <mountpoint>                     the module mounted it
//! H <pid> <start time> <mountpoint>  a session holding it: the process that opened it
//! ```
//!
//! A session is the process that called pam_open_session (sshd's privileged process of the
//! connection, login, su...), named by its pid and start time (so a reused pid is not it).
//! Holders whose process is gone (a login program killed before it closed its session) are
//! dropped whenever the file is read.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// A process, by pid and start time (clock ticks after boot, /proc/PID/stat field 22).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub start: u64,
}

impl Holder {
    /// The calling process.
    pub fn this_process() -> Option<Holder> {
        let pid = std::process::id();
        Some(Holder {
            pid,
            start: start_time(pid)?,
        })
    }

    fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name start at field 3 (state); start time is field 22.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// The locked state file of one user; saved and unlocked on [`State::save`].
pub struct State {
    file: File,
    marks: Vec<PathBuf>,
    holders: Vec<(Holder, PathBuf)>,
}

impl State {
    /// Opens (creating) and locks the state of user `uid` in `dir` (created, mode 0700).
    pub fn lock(dir: &Path, uid: u32) -> io::Result<State> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(dir.join(format!("{uid}.sessions")))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let mut st = State {
            file,
            marks: Vec::new(),
            holders: Vec::new(),
        };
        for line in text.lines() {
            let mut f = line.splitn(2, ' ');
            match (f.next(), f.next()) {
                (Some("M"), Some(mp)) => st.marks.push(mp.into()),
                (Some("H"), Some(rest)) => {
                    let mut g = rest.splitn(3, ' ');
                    if let (Some(Ok(pid)), Some(Ok(start)), Some(mp)) =
                        (g.next().map(str::parse), g.next().map(str::parse), g.next())
                    {
                        let h = Holder { pid, start };
                        if h.alive() {
                            st.holders.push((h, mp.into()));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(st)
    }

    /// Whether the module mounted `mp`.
    pub fn marked(&self, mp: &Path) -> bool {
        self.marks.iter().any(|m| m == mp)
    }

    /// Records that the module mounted `mp` (dropping holders of an earlier mount there).
    pub fn mark(&mut self, mp: &Path) {
        self.holders.retain(|(_, m)| m != mp);
        if !self.marked(mp) {
            self.marks.push(mp.to_path_buf());
        }
    }

    pub fn unmark(&mut self, mp: &Path) {
        self.marks.retain(|m| m != mp);
        self.holders.retain(|(_, m)| m != mp);
    }

    pub fn hold(&mut self, h: Holder, mp: &Path) {
        if !self.holders.iter().any(|(o, m)| *o == h && m == mp) {
            self.holders.push((h, mp.to_path_buf()));
        }
    }

    /// Drops `h`'s hold on `mp`; returns how many sessions still hold it.
    pub fn release(&mut self, h: Holder, mp: &Path) -> usize {
        self.holders.retain(|(o, m)| !(*o == h && m == mp));
        self.holders.iter().filter(|(_, m)| m == mp).count()
    }

    /// Writes the state back (and unlocks it, when dropped).
    pub fn save(mut self) -> io::Result<()> {
        let mut text = String::new();
        for m in &self.marks {
            text.push_str(&format!("M {}\n", m.display()));
        }
        for (h, m) in &self.holders {
            text.push_str(&format!("H {} {} {}\n", h.pid, h.start, m.display()));
        }
        self.file.set_len(0)?;
        self.file.rewind()?;
        self.file.write_all(text.as_bytes())?;
        self.file.sync_data()
    }
}

/// Whether a cloakfs file system is mounted at `mp` (in this process's mount namespace).
pub fn cloakfs_mounted_at(mp: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|l| {
        let mut halves = l.splitn(2, " - ");
        let (Some(left), Some(right)) = (halves.next(), halves.next()) else {
            return false;
        };
        left.split(' ').nth(4).map(unescape).as_deref() == Some(mp.as_os_str().as_encoded_bytes())
            && right.split(' ').next() == Some("fuse.cloakfs")
    })
}

/// A mountinfo field with its octal escapes (`\040` for a blank, ...) undone.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..=i + 3].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// `p` with its parent directory resolved (the mount point itself is not touched: looking
/// at another user's FUSE mount as root is refused).
pub fn resolve_mountpoint(p: &Path) -> io::Result<PathBuf> {
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        return Ok(p.to_path_buf());
    };
    Ok(std::fs::canonicalize(parent)?.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_survive_a_reload_and_the_dead_go() {
        let dir = std::env::temp_dir().join(format!("pam-cloakfs-test-{}", std::process::id()));
        let me = Holder::this_process().unwrap();
        let dead = Holder {
            pid: me.pid,
            start: me.start + 1,
        };
        let mp = Path::new("/home/a b/Private");
        let mut st = State::lock(&dir, 4242).unwrap();
        st.mark(mp);
        st.hold(me, mp);
        st.hold(dead, mp);
        st.save().unwrap();
        let mut st = State::lock(&dir, 4242).unwrap();
        assert!(st.marked(mp));
        // The dead holder was dropped at load: releasing ours leaves none.
        assert_eq!(st.release(me, mp), 0);
        st.unmark(mp);
        st.save().unwrap();
        assert!(!State::lock(&dir, 4242).unwrap().marked(mp));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/home/a\040b"), b"/home/a b");
        assert_eq!(unescape(r"/x\134y"), b"/x\\y");
        assert_eq!(unescape(r"/plain"), b"/plain");
        assert!(!cloakfs_mounted_at(Path::new("/")));
    }
}
