//! Ending a mount cleanly on SIGTERM, SIGINT or SIGHUP: the signal unmounts the file system,
//! so the serving loop returns normally, after the kernel has handed over every cached write.

use std::path::PathBuf;

const SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// Blocks the signals in this thread (threads started later inherit the mask) and starts a
/// thread that waits for one and then detaches the mount at `mountpoint`.
pub fn unmount_on_signal(mountpoint: PathBuf) {
    on_signal(move |sig| {
        tracing::info!("signal {sig}: unmounting {}", mountpoint.display());
        // Lazy: open files keep working until closed, and nothing is lost.
        let _ = std::process::Command::new("fusermount3")
            .arg("-uz")
            .arg(&mountpoint)
            .stdin(std::process::Stdio::null())
            .status();
    });
}

/// Blocks the signals in this thread (threads started later inherit the mask) and starts a
/// thread that waits for the first one and calls `then` with it.
pub fn on_signal(then: impl FnOnce(i32) + Send + 'static) {
    // SAFETY: sigset operations on a zeroed, local sigset_t, then pthread_sigmask on it.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let _ = std::thread::Builder::new()
        .name("cloakfs-signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: sigwait on a valid set with a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                return;
            }
            then(sig);
        });
}
