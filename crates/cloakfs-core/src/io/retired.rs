//! Retired file IDs of a sharing volume (docs/FORMAT.md section 18.8): the IDs of files that
//! `share remove` replaced by a fresh file (new ID, new key). A header with a retired ID is an
//! older copy put back by the storage (a rollback), which would let the removed member read
//! what is written next; it is refused.
//!
//! Two records, each a set that only grows:
//! - in the volume, `cloakfs.retired/<32 hex digits of the ID>`, holding
//!   HMAC-SHA256(K_retired, domain || ID): every member's mount sees a removal done anywhere
//!   (one file per ID, so that sync clients and concurrent writers never merge two versions of
//!   one file); a record with a wrong MAC is ignored;
//! - on this machine, `<state dir>/retired/<volume ID>`, 16 bytes per ID: what this user's
//!   mounts have seen stays known after the storage deletes the volume's records (a rollback of
//!   the records themselves).
//!
//! The volume's directory is listed again whenever its modification time changes, so a mount
//! learns of another machine's removal at its next open of a file.
//!
//! The same grow-only set, under its own directory, domain and key, holds an adopted tree's
//! retired plaintext entries (`io::plain_list`): [`RetiredIds::open_set`].

use crate::crypto::prf::Prf;
use crate::crypto::secret::SecretBytes;
use crate::error::Result;
use crate::format::content::FileId;
use crate::format::filekey::RetiredFiles;
use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The directory of a sharing volume's retirement records, in its root.
pub const RETIRED_DIR: &str = "cloakfs.retired";
/// First bytes of a record's MAC input.
const DOMAIN: &[u8] = b"cloakfs retired file id\n";

/// The retired IDs of one volume, from its records and this machine's (see the module
/// documentation).
pub struct RetiredIds {
    dir: PathBuf,
    /// The records' directory name, in the cipher directory.
    records: &'static str,
    /// First bytes of a record's MAC input.
    domain: &'static [u8],
    /// The cipher directory (`O_PATH`): the records' directory is looked at through it, one
    /// path component per open rather than the whole path.
    root: Option<std::os::fd::OwnedFd>,
    local: Option<PathBuf>,
    key: Prf,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    ids: HashSet<[u8; 16]>,
    /// The records directory's (inode, mtime) when it was last listed.
    listed: Option<(u64, i64, i64)>,
}

fn hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(name: &str) -> Option<[u8; 16]> {
    if name.len() != 32 || !name.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&name[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(id)
}

impl RetiredIds {
    /// The records of the volume in `cipherdir`, under `key` (HKDF(master key,
    /// "share-retired")), and this machine's record at `local` (`None`: none is kept).
    pub fn open(cipherdir: &Path, key: SecretBytes<32>, local: Option<PathBuf>) -> Self {
        Self::open_set(cipherdir, RETIRED_DIR, DOMAIN, key, local)
    }

    /// A set of retired 16-byte values of the volume in `cipherdir`: records in directory
    /// `records` of it, each HMAC-SHA256(`key`, `domain` || value), and this machine's copy at
    /// `local`.
    pub fn open_set(
        cipherdir: &Path,
        records: &'static str,
        domain: &'static [u8],
        key: SecretBytes<32>,
        local: Option<PathBuf>,
    ) -> Self {
        let mut state = State::default();
        if let Some(l) = &local {
            if let Ok(b) = std::fs::read(l) {
                for c in b.chunks_exact(16) {
                    state.ids.insert(c.try_into().expect("16 bytes"));
                }
            }
        }
        let root = rustix::fs::open(
            cipherdir,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok();
        Self {
            root,
            dir: cipherdir.join(records),
            records,
            domain,
            local,
            key: Prf::new(&key),
            state: Mutex::new(state),
        }
    }

    fn mac(&self, id: &[u8; 16]) -> [u8; 32] {
        self.key.out(&[self.domain, id])
    }

    /// Lists the volume's records again if they changed since the last listing; IDs new to
    /// this machine go into its record too.
    fn refresh(&self, st: &mut State) {
        let meta = match &self.root {
            Some(root) => rustix::fs::statat(root, self.records, rustix::fs::AtFlags::empty()),
            None => rustix::fs::stat(&self.dir),
        };
        let Ok(meta) = meta else {
            return;
        };
        let stamp = (meta.st_ino, meta.st_mtime, meta.st_mtime_nsec as i64);
        if st.listed == Some(stamp) {
            return;
        }
        st.listed = Some(stamp);
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut new = Vec::new();
        for e in entries.flatten() {
            let Some(id) = e.file_name().to_str().and_then(unhex) else {
                continue;
            };
            if st.ids.contains(&id) {
                continue;
            }
            match std::fs::read(e.path()) {
                Ok(mac) if subtle::ConstantTimeEq::ct_eq(&mac[..], &self.mac(&id)[..]).into() => {
                    new.push(id)
                }
                _ => tracing::warn!(
                    "{}: a retirement record that does not authenticate (ignored)",
                    e.path().display()
                ),
            }
        }
        for id in new {
            self.remember_locally(&id);
            st.ids.insert(id);
        }
    }

    fn remember_locally(&self, id: &[u8; 16]) {
        let Some(l) = &self.local else { return };
        let r = (|| -> std::io::Result<()> {
            if let Some(d) = l.parent() {
                std::fs::create_dir_all(d)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(l)?;
            f.write_all(id)?;
            f.sync_data()
        })();
        if let Err(e) = r {
            tracing::warn!("{}: cannot keep a retired file ID: {e}", l.display());
        }
    }
}

/// Moves the volume's retirement records in `cipherdir` from key `from` to key `to` (a rekey);
/// a record already right under `to` stays, one right under neither is left as it is (it was
/// ignored before and stays ignored). Returns how many were rewritten.
pub fn rekey_records(cipherdir: &Path, from: SecretBytes<32>, to: SecretBytes<32>) -> Result<u64> {
    let (from, to) = (
        RetiredIds::open(cipherdir, from, None),
        RetiredIds::open(cipherdir, to, None),
    );
    let entries = match std::fs::read_dir(&to.dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut moved = 0;
    for e in entries {
        let e = e?;
        let Some(id) = e.file_name().to_str().and_then(unhex) else {
            continue;
        };
        let mac = std::fs::read(e.path())?;
        let under = |k: &RetiredIds| -> bool {
            subtle::ConstantTimeEq::ct_eq(&mac[..], &k.mac(&id)[..]).into()
        };
        if !under(&to) && under(&from) {
            let f = std::fs::OpenOptions::new().write(true).open(e.path())?;
            std::os::unix::fs::FileExt::write_all_at(&f, &to.mac(&id), 0)?;
            f.sync_data()?;
            moved += 1;
        }
    }
    Ok(moved)
}

impl RetiredIds {
    /// Whether `value` is retired, here or (records changed since last looked at) anywhere.
    pub fn contains(&self, value: &[u8; 16]) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.ids.contains(value) {
            return true;
        }
        self.refresh(&mut st);
        st.ids.contains(value)
    }

    /// Retires `value`: on this machine, then durably in the volume's records.
    pub fn insert(&self, value: &[u8; 16]) -> Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.ids.insert(*value) {
            self.remember_locally(value);
        }
        match std::fs::create_dir(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e.into()),
        }
        let path = self.dir.join(hex(value));
        let mut f = std::fs::File::create(&path)?;
        f.write_all(&self.mac(value))?;
        f.sync_all()?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        Ok(())
    }
}

impl RetiredFiles for RetiredIds {
    fn is_retired(&self, id: &FileId) -> bool {
        self.contains(&id.0)
    }

    fn retire(&self, id: &FileId) -> Result<()> {
        self.insert(&id.0)
    }
}
