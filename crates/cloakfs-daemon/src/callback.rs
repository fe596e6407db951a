//! Timeout callbacks (NCryptfs 3.5): `/bin/sh -c CMD sh NAME REASON` run as the user who set
//! the callback (the attach's owner for `attach --callback`, the granter for `authz add
//! --callback`; never the session's user, and root only if root set it), in a new Unix
//! session, with standard input and output on /dev/null. The daemon does not wait for it; a
//! thread reaps it.

use crate::peer::{euid, user_info};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// Starts the callback; failures are logged, never fatal.
pub fn spawn(uid: u32, cmd: &str, name: &str, reason: &str) {
    let user = match user_info(uid) {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(uid, attach = name, "callback not run: {e}");
            return;
        }
    };
    let mut c = Command::new("/bin/sh");
    c.arg("-c")
        .arg(cmd)
        .arg("sh")
        .arg(name)
        .arg(reason)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .current_dir("/")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &user.home)
        .env("USER", &user.name)
        .env("LOGNAME", &user.name);
    let switch = euid() != uid;
    let (gid, groups) = (user.gid, user.groups.clone());
    // SAFETY: the closure runs in the forked child before exec and only makes raw system
    // calls (setsid, setgroups, setresgid, setresuid) on data prepared before the fork.
    unsafe {
        c.pre_exec(move || {
            libc::setsid();
            if switch {
                let ok = libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) == 0
                    && libc::syscall(libc::SYS_setresgid, gid, gid, gid) == 0
                    && libc::syscall(libc::SYS_setresuid, uid, uid, uid) == 0;
                if !ok {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    match c.spawn() {
        Ok(mut child) => {
            tracing::info!(uid, attach = name, reason, "callback started");
            let _ = std::thread::Builder::new()
                .name("cloakfs-reap".into())
                .spawn(move || {
                    let _ = child.wait();
                });
        }
        Err(e) => tracing::warn!(uid, attach = name, reason, "callback failed to start: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn runs_with_name_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let cmd = format!(
            "echo \"$1 $2 $(id -u)\" > {}.tmp && mv {0}.tmp {0}",
            out.display()
        );
        spawn(euid(), &cmd, "proj", "idle");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !out.exists() {
            assert!(Instant::now() < deadline, "callback did not run");
            std::thread::yield_now();
        }
        let text = std::fs::read_to_string(&out).unwrap();
        assert_eq!(text.trim(), format!("proj idle {}", euid()));
    }
}
