//! A throwaway GNUPGHOME for the gpg tests (key slots, shared files).

use std::path::Path;
use std::process::Command;

/// A GNUPGHOME under /tmp (short: gpg-agent's socket path must fit in sockaddr_un) with keys
/// made by Debian's gnupg, without passphrase; its gpg-agent is stopped on drop.
pub struct GnuPgHome(tempfile::TempDir);

impl GnuPgHome {
    /// A keyring with one new key per user ID in `uids` (none: an empty keyring).
    pub fn new(uids: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("gpg")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        for uid in uids {
            let out = Command::new("gpg")
                .env("GNUPGHOME", dir.path())
                .args(["--batch", "--pinentry-mode", "loopback", "--passphrase", ""])
                .args(["--quick-gen-key", uid, "future-default", "default", "never"])
                .output()
                .expect("gpg is not installed: run scripts/install-deps.sh");
            assert!(
                out.status.success(),
                "gpg: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self(dir)
    }

    /// The directory, for `GNUPGHOME`.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// The fingerprint of the first key in the keyring.
    pub fn fingerprint(&self) -> String {
        let out = Command::new("gpg")
            .env("GNUPGHOME", self.path())
            .args(["--with-colons", "--list-keys"])
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let fpr = text
            .lines()
            .find(|l| l.starts_with("fpr:"))
            .and_then(|l| l.split(':').nth(9))
            .expect("a key in the keyring");
        fpr.to_string()
    }
}

impl Drop for GnuPgHome {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .env("GNUPGHOME", self.path())
            .args(["--kill", "gpg-agent"])
            .output();
    }
}
