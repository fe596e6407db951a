//! Pass 1: file contents, symlink targets and xattrs re-encrypted under the target key, no
//! name changed (see the module documentation of `rekey`).

use super::engine::{
    punch_hole, sorted_names, sync_dir, sync_fs, tampered_at, temp_name, timestamps, Engine, State,
    BATCH_BYTES, BATCH_FILES,
};
use crate::crypto::keys::label;
use crate::error::{Error, Result};
use crate::format::content::{FileHeader, FileId};
use crate::tools::blocks::{BlockReader, BlockState, CHUNK_BLOCKS};
use crate::tools::walk::is_payload;
use crate::volume::Volume;
use rayon::prelude::*;
use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

impl Engine<'_> {
    /// Pass 1: file contents, symlink targets and xattrs (and a sharing volume's retirement
    /// records). No name changes.
    pub(super) fn contents(&mut self) -> Result<()> {
        self.xattrs(&self.root.clone())?;
        if self.to.is_sharing() {
            let key = |v: &Volume| {
                v.master_key()
                    .subkey(&v.config().params.volume_id, label::SHARE_RETIRED)
            };
            crate::io::retired::rekey_records(&self.root, key(self.from), key(self.to))?;
        }
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let names = sorted_names(&dir)?;
            for name in names.iter().filter(|n| is_payload(n)) {
                self.check_cancel()?;
                let path = dir.join(name);
                let meta = std::fs::symlink_metadata(&path)?;
                let t = meta.file_type();
                if t.is_file() && self.to.is_sharing() {
                    // Its contents are under its own file key (FORMAT.md 18), not the master
                    // key: only its header's volume MAC and its xattrs move. (`share remove`
                    // gives a file a new key.)
                    match crate::tools::share::reseal_header(self.from, self.to, &path) {
                        Ok(_) => {}
                        Err(Error::Io(e)) => return Err(e.into()),
                        Err(e) => self.damaged(&path, e)?,
                    }
                    self.xattrs(&path)?;
                    self.progress.advance(meta.len(), 1);
                    continue;
                }
                if t.is_file() {
                    self.reported = 0;
                    self.file(&path, &meta)?;
                    self.progress
                        .advance(meta.len().saturating_sub(self.reported), 1);
                    continue;
                }
                if t.is_symlink() {
                    self.symlink(&path, &meta)?;
                } else {
                    self.xattrs(&path)?;
                }
                if t.is_dir() {
                    stack.push(path);
                }
                self.progress.advance(0, 1);
            }
        }
        Ok(())
    }

    /// The state of a file's content: under the target key, the source key, or neither.
    pub(super) fn file_state(&mut self, path: &Path) -> Result<Option<(State, BlockReader)>> {
        let to = match BlockReader::open(self.to.content(), File::open(path)?) {
            Ok(r) => r,
            Err(Error::Io(e)) => return Err(e.into()),
            Err(e) => return self.damaged(path, e).map(|()| None),
        };
        if let Some(d) = to.damage() {
            return self.damaged(path, d).map(|()| None);
        }
        let mut b = 0;
        while b < to.block_count() {
            let c = to.read_chunk(b, 16, &mut self.out, &mut self.sealed)?;
            match c.states.iter().position(|s| *s != BlockState::Hole) {
                Some(i) if c.states[i] == BlockState::Data => return Ok(Some((State::Done, to))),
                Some(i) => {
                    let from = BlockReader::open(self.from.content(), File::open(path)?)?;
                    let first = b + i as u64;
                    let c = from.read_chunk(first, 1, &mut self.out, &mut self.sealed)?;
                    if c.states.first() == Some(&BlockState::Data) {
                        return Ok(Some((State::Todo, from)));
                    }
                    let e = format!("block {first} opens under neither key (tampered or damaged)");
                    return self.damaged(path, e).map(|()| None);
                }
                None => b += c.states.len() as u64,
            }
        }
        Ok(None) // empty, or only holes: nothing is keyed
    }

    /// An entry that opens under neither key. A rekey stops there (converting the rest and
    /// swapping keys would make its readable parts unreadable); a rollback leaves it as it is
    /// (it was never converted: a rekey only ever writes complete, verified copies).
    pub(super) fn damaged(&mut self, path: &Path, m: impl std::fmt::Display) -> Result<()> {
        if self.rollback {
            self.summary
                .damaged
                .push(format!("{}: {m}", path.display()));
            return Ok(());
        }
        Err(tampered_at(
            path,
            format!(
                "{m}; rekey stopped: roll back (`cloakfs rekey --rollback`), then restore or \
                 remove the damaged entry (see `cloakfs fsck`)"
            ),
        ))
    }

    pub(super) fn file(&mut self, path: &Path, meta: &Metadata) -> Result<()> {
        let (state, r) = match self.file_state(path)? {
            None => return self.xattrs(path),
            Some(x) => x,
        };
        if state == State::Done {
            self.summary.already += 1;
            return self.xattrs(path);
        }
        let dir = path.parent().expect("entries have a parent");
        let tmp = dir.join(temp_name());
        let in_place = meta.nlink() > 1;
        if let Err(e) = self.reencrypt(&r, &tmp, path, meta, !in_place) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        self.summary.files += 1;
        self.summary.bytes += meta.len();
        if in_place {
            // Several names share this inode: keep it, so they all stay one file.
            File::open(&tmp)?.sync_all()?;
            let redo = dir.join(format!("{REDO_PREFIX}{}", meta.ino()));
            std::fs::rename(&tmp, &redo)?;
            sync_dir(dir)?;
            self.step();
            self.apply_redo(&redo, path)?;
            self.summary.in_place += 1;
            return self.xattrs(path);
        }
        self.pending_bytes += meta.len();
        self.pending.push((tmp, path.to_path_buf()));
        if self.pending.len() >= BATCH_FILES || self.pending_bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Copies a committed redo file over the inode it was made for (same length and block
    /// layout; holes punched where the copy has them), makes that durable, then removes the
    /// redo file. Idempotent: a crash at any point is finished by doing it again.
    pub(super) fn apply_redo(&mut self, redo: &Path, target: &Path) -> Result<()> {
        let src = File::open(redo)?;
        let smeta = src.metadata()?;
        let dst = std::fs::OpenOptions::new().write(true).open(target)?;
        let cbs = self.to.content().layout().cipher_block_size();
        let len = smeta.len();
        let header = crate::format::layout::HEADER_LEN;
        let mut buf = vec![0u8; (cbs * CHUNK_BLOCKS) as usize];
        let mut h = [0u8; crate::format::layout::HEADER_LEN as usize];
        src.read_exact_at(&mut h[..header.min(len) as usize], 0)?;
        dst.write_all_at(&h[..header.min(len) as usize], 0)?;
        let mut off = header;
        while off < len {
            let n = (len - off).min(buf.len() as u64) as usize;
            src.read_exact_at(&mut buf[..n], off)?;
            for (i, block) in buf[..n].chunks(cbs as usize).enumerate() {
                let at = off + i as u64 * cbs;
                if block.len() as u64 == cbs && block.iter().all(|&b| b == 0) {
                    punch_hole(&dst, at, cbs)?;
                } else {
                    dst.write_all_at(block, at)?;
                }
            }
            off += n as u64;
        }
        dst.set_len(len)?;
        rustix::fs::futimens(&dst, &timestamps(&smeta)).map_err(std::io::Error::from)?;
        dst.sync_all()?;
        std::fs::remove_file(redo)?;
        self.step();
        Ok(())
    }

    /// Writes the re-encrypted copy of `r` (backing file `path`) to `tmp` under a fresh file ID,
    /// with the same holes and times and, if `with_meta`, the same owner, mode and xattrs.
    pub(super) fn reencrypt(
        &mut self,
        r: &BlockReader,
        tmp: &Path,
        path: &Path,
        meta: &Metadata,
        with_meta: bool,
    ) -> Result<()> {
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)?;
        let new_id = FileId::random();
        out.write_all_at(&FileHeader { id: new_id }.to_bytes(), 0)?;
        let cipher = self.to.content().file_cipher(new_id);
        let layout = r.layout();
        let (bs, cbs) = (
            layout.block_size() as usize,
            layout.cipher_block_size() as usize,
        );
        let mut b = 0;
        while b < r.block_count() {
            let chunk = r.read_chunk(b, CHUNK_BLOCKS, &mut self.plain, &mut self.sealed)?;
            if let Some(bad) = chunk.first_failure() {
                return Err(tampered_at(
                    path,
                    format!(
                        "block {bad} fails authentication; rekey stopped: roll back \
                         (`cloakfs rekey --rollback`), then restore or remove the damaged file \
                         (see `cloakfs fsck`)"
                    ),
                ));
            }
            self.out.clear();
            self.out.resize(self.sealed.len(), 0);
            // One getrandom(2) for the chunk (holes leave their nonce unused).
            let nonces = cipher.fresh_nonces(chunk.states.len());
            self.out
                .par_chunks_mut(cbs)
                .zip(self.plain.par_chunks(bs))
                .zip(chunk.states.par_iter())
                .zip(nonces)
                .enumerate()
                .for_each(|(i, (((o, p), s), nonce))| {
                    if *s == BlockState::Data {
                        cipher.seal_fresh(b + i as u64, nonce, p, o);
                    }
                });
            // Write runs of data blocks; holes stay holes.
            let base = layout.cipher_offset(b);
            let n = chunk.states.len();
            let mut i = 0;
            while i < n {
                if chunk.states[i] == BlockState::Hole {
                    i += 1;
                    continue;
                }
                let start = i;
                while i < n && chunk.states[i] == BlockState::Data {
                    i += 1;
                }
                let s = start * cbs;
                let e = (i * cbs).min(self.out.len());
                out.write_all_at(&self.out[s..e], base + s as u64)?;
            }
            b += n as u64;
            self.progress.advance(self.sealed.len() as u64, 0);
            self.reported += self.sealed.len() as u64;
        }
        out.set_len(r.backing_len())?;
        if with_meta {
            // Owner first (chown clears set-id bits), then mode and xattrs.
            let _ = rustix::fs::fchown(
                &out,
                Some(rustix::fs::Uid::from_raw(meta.uid())),
                Some(rustix::fs::Gid::from_raw(meta.gid())),
            );
            rustix::fs::fchmod(&out, rustix::fs::Mode::from_raw_mode(meta.mode() & 0o7777))
                .map_err(std::io::Error::from)?;
            self.copy_xattrs(path, tmp)?;
        }
        rustix::fs::futimens(&out, &timestamps(meta)).map_err(std::io::Error::from)?;
        Ok(())
    }

    /// Makes the pending temporaries durable, then renames each over its original.
    pub(super) fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        sync_fs(&self.root)?;
        for (tmp, path) in std::mem::take(&mut self.pending) {
            std::fs::rename(&tmp, &path)?;
            self.step();
        }
        self.pending_bytes = 0;
        Ok(())
    }

    pub(super) fn symlink(&mut self, path: &Path, meta: &Metadata) -> Result<()> {
        use crate::io::long_targets;
        let stored = std::fs::read_link(path)?;
        let stored = stored.as_os_str().as_bytes();
        if long_targets::read_target_at(self.to.meta(), &self.root, stored).is_ok() {
            self.summary.already += 1;
            return Ok(());
        }
        let target = match long_targets::read_target_at(self.from.meta(), &self.root, stored) {
            Ok(t) => t,
            Err(e) => return self.damaged(path, e),
        };
        let new = self.to.meta().encrypt_symlink(&target)?;
        // A long target's new file is durable before the symlink points to it; the old one
        // goes once its last symlink does (a crash in between leaves an unreferenced file,
        // which fsck --repair removes).
        long_targets::store_at(&self.root, &new)?;
        let old_long = crate::format::meta::long_target_name(stored)
            .filter(|_| meta.nlink() == 1)
            .map(str::to_string);
        let tmp = path
            .parent()
            .expect("entries have a parent")
            .join(temp_name());
        std::os::unix::fs::symlink(new.backing_target(), &tmp)?;
        let _ = std::os::unix::fs::lchown(&tmp, Some(meta.uid()), Some(meta.gid()));
        let _ = crate::tools::export::set_times_nofollow(&tmp, meta);
        if let Err(e) = std::fs::rename(&tmp, path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        if let Some(old) = old_long {
            let root = std::fs::File::open(&self.root)?;
            long_targets::remove(std::os::fd::AsFd::as_fd(&root), &old);
        }
        self.step();
        self.summary.symlinks += 1;
        Ok(())
    }

    /// Decides which key a `user.` xattr opens under; returns its plaintext name and value if
    /// it needs converting.
    pub(super) fn xattr_state(
        &mut self,
        path: &Path,
        stored: &[u8],
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let value = crate::io::xattrs::get(path, stored)?;
        let to = self.to.meta();
        if to.decrypt_xattr_name(stored).is_ok() && to.decrypt_xattr_value(stored, &value).is_ok() {
            return Ok(None);
        }
        let from = self.from.meta();
        match (
            from.decrypt_xattr_name(stored),
            from.decrypt_xattr_value(stored, &value),
        ) {
            (Ok(n), Ok(v)) => Ok(Some((n, v))),
            _ => {
                let m = format!(
                    "xattr {} opens under neither key",
                    String::from_utf8_lossy(stored)
                );
                self.damaged(path, m).map(|()| None)
            }
        }
    }

    /// Re-encrypts the `user.` xattrs of `path` in place.
    pub(super) fn xattrs(&mut self, path: &Path) -> Result<()> {
        for stored in crate::io::xattrs::list(path)?
            .into_iter()
            .filter(|n| crate::io::xattrs::is_user(n))
        {
            let Some((name, value)) = self.xattr_state(path, &stored)? else {
                continue;
            };
            let meta = self.to.meta();
            let new_name = meta.encrypt_xattr_name(&name)?.expect("a user. name");
            let new_value = meta.encrypt_xattr_value(&new_name, &value)?;
            crate::io::xattrs::set(path, &new_name, &new_value)?;
            self.step();
            crate::io::xattrs::remove(path, &stored)?;
            self.step();
            self.summary.xattrs += 1;
        }
        Ok(())
    }

    /// Copies every xattr of `src` to `dst`, `user.` ones re-encrypted under the target key.
    /// Security labels the process may not set are skipped.
    pub(super) fn copy_xattrs(&mut self, src: &Path, dst: &Path) -> Result<()> {
        for stored in crate::io::xattrs::list(src)? {
            if !crate::io::xattrs::is_user(&stored) {
                let v = crate::io::xattrs::get(src, &stored)?;
                match crate::io::xattrs::set(dst, &stored, &v) {
                    Err(_) if stored.starts_with(b"security.") => {}
                    r => r?,
                }
                continue;
            }
            let (name, value) = match self.xattr_state(src, &stored)? {
                Some(x) => x,
                None => {
                    let to = self.to.meta();
                    let v = crate::io::xattrs::get(src, &stored)?;
                    match (
                        to.decrypt_xattr_name(&stored),
                        to.decrypt_xattr_value(&stored, &v),
                    ) {
                        (Ok(n), Ok(v)) => (n, v),
                        _ => {
                            // Damaged (a rollback keeps it): copied as it is.
                            crate::io::xattrs::set(dst, &stored, &v)?;
                            continue;
                        }
                    }
                }
            };
            let meta = self.to.meta();
            let new_name = meta.encrypt_xattr_name(&name)?.expect("a user. name");
            let new_value = meta.encrypt_xattr_value(&new_name, &value)?;
            crate::io::xattrs::set(dst, &new_name, &new_value)?;
            self.summary.xattrs += 1;
        }
        Ok(())
    }
}

/// Prefix of a committed in-place conversion (followed by the inode number).
pub(super) const REDO_PREFIX: &str = "cloakfs.rekey.tmp.redo.";

/// The entry of `dir` (among `names`) that is the regular file with inode number `ino`.
pub(super) fn find_inode(dir: &Path, names: &[OsString], ino: u64) -> Option<PathBuf> {
    names
        .iter()
        .filter(|n| is_payload(n))
        .map(|n| dir.join(n))
        .find(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file() && m.ino() == ino))
}
