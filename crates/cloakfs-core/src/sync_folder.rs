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

/// Whether `name` is a sync client's copy of a directory's `cloakfs.dirid`: the losing side of
/// a conflict between two devices that gave one directory different IDs, renamed by the client
/// (Syncthing `cloakfs.sync-conflict-YYYYMMDD-HHMMSS-DEVICE.dirid`, Dropbox
/// `cloakfs (NAME's conflicted copy DATE).dirid`, Nextcloud `cloakfs (conflicted copy DATE
/// TIME).dirid`, OneDrive `cloakfs-HOST.dirid`, generic `cloakfs (1).dirid`). Such a file
/// holds another 16-byte ID the directory's entries may be named under.
pub fn is_dir_id_copy(name: &[u8]) -> bool {
    name.starts_with(b"cloakfs")
        && name != crate::format::names::DIRID_FILE.as_bytes()
        && name.windows(5).any(|w| w == b"dirid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_clients_copies_of_an_id_file_are_known_and_others_are_not() {
        for n in [
            "cloakfs.sync-conflict-20261128-151500-K64EJMH.dirid",
            "cloakfs (Ann's conflicted copy 2026-11-28).dirid",
            "cloakfs (conflicted copy 2026-11-28 151500).dirid",
            "cloakfs-LAPTOP.dirid",
            "cloakfs (1).dirid",
        ] {
            assert!(is_dir_id_copy(n.as_bytes()), "{n}");
        }
        for n in [
            "cloakfs.dirid",
            "cloakfs.conf",
            "cloakfs.long.abc.name",
            "dirid",
            "x.dirid",
        ] {
            assert!(!is_dir_id_copy(n.as_bytes()), "{n}");
        }
    }

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
