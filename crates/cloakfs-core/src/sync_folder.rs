//! What sync clients keep in the folders they synchronize: a cipher directory that is such a
//! folder (or lies in one) holds these files beside cloakfs's own, and they say nothing about
//! the volume.

/// Names a sync client keeps in the root of a synchronized folder: Syncthing (`.stfolder`,
/// `.stignore`, `.stversions`), Dropbox (`.dropbox`, `.dropbox.cache`), Resilio (`.sync`),
/// Nextcloud and ownCloud (`.sync_*.db*`, `.owncloudsync.log`, `.nextcloudsync.log`), and
/// macOS's Finder (`.DS_Store`).
pub fn is_client_metadata(name: &[u8]) -> bool {
    const EXACT: [&[u8]; 9] = [
        b".stfolder",
        b".stignore",
        b".stversions",
        b".dropbox",
        b".dropbox.cache",
        b".sync",
        b".owncloudsync.log",
        b".nextcloudsync.log",
        b".DS_Store",
    ];
    EXACT.contains(&name) || (name.starts_with(b".sync_") && name.windows(3).any(|w| w == b".db"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_clients_own_files_are_known_and_others_are_not() {
        for n in [
            ".stfolder",
            ".stversions",
            ".dropbox.cache",
            ".sync_1a2b3c.db",
            ".sync_journal.db-wal",
        ] {
            assert!(is_client_metadata(n.as_bytes()), "{n}");
        }
        for n in [".hidden", ".sync_notes.txt", "stfolder", ".stfolder2"] {
            assert!(!is_client_metadata(n.as_bytes()), "{n}");
        }
    }
}
