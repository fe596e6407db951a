//! Directory handles and listings: each handle reads a snapshot of the decrypted listing,
//! with or without the attributes of every entry (readdirplus).

use crate::attr::negative_attr;
use crate::dir::{DirHandle, ListEntry};
use crate::fs::CloakFs;
use crate::inode::Kind;
use crate::sys::Res;
use fuser::{Errno, FileHandle, FileType, Generation, INodeNo, ReplyDirectory, ReplyDirectoryPlus};
use std::sync::Arc;
use std::time::Duration;

impl CloakFs {
    pub(crate) fn do_opendir(&self, ino: INodeNo) -> Res<u64> {
        let inode = self.node(ino)?;
        if inode.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let fh = self.new_fh();
        self.dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, Arc::new(DirHandle::default()));
        Ok(fh)
    }

    /// The listing of directory handle `fh` and the index in it where `offset` resumes.
    /// A pass that starts at offset 0 takes a fresh snapshot of the directory; later calls
    /// continue in it, so one pass never sees an entry twice whatever changes meanwhile.
    fn snapshot(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
    ) -> Res<(Arc<DirHandle>, Arc<Vec<ListEntry>>, usize)> {
        let handle = self
            .dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fh.0)
            .cloned()
            .ok_or(Errno::EBADF)?;
        let mut st = handle.state.lock().unwrap_or_else(|e| e.into_inner());
        if offset != 0 {
            if let Some(entries) = &st.entries {
                let hint = st.resume.checked_sub(1).and_then(|i| entries.get(i));
                let at = if hint.is_some_and(|e| e.next == offset) {
                    Some(st.resume)
                } else {
                    entries.iter().position(|e| e.next == offset).map(|i| i + 1)
                };
                if let Some(at) = at {
                    let entries = entries.clone();
                    drop(st);
                    return Ok((handle, entries, at));
                }
            }
        }
        // A new pass, or an offset from elsewhere (the kernel's listing cache): read the
        // backing directory from there.
        let inode = self.node(ino)?;
        // Each pass follows an ID file the sync client replaced since the last one, and
        // notices a changed config (refusing writes is all it does: a listing goes on).
        self.reload_dir_id(&inode);
        let _ = self.follow_config();
        let entries = Arc::new(self.list(&inode, offset)?);
        st.entries = Some(entries.clone());
        st.resume = 0;
        drop(st);
        Ok((handle, entries, 0))
    }

    /// Records where the reply to a readdir of `handle` stopped.
    fn stopped_at(handle: &DirHandle, index: usize) {
        handle
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .resume = index;
    }

    pub(crate) fn do_readdir(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let (handle, entries, start) = match self.snapshot(ino, fh, offset) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        let mut stop = entries.len();
        for (i, e) in entries.iter().enumerate().skip(start) {
            if reply.add(INodeNo(e.ino), e.next, e.kind, &e.name) {
                stop = i;
                break;
            }
        }
        Self::stopped_at(&handle, stop);
        reply.ok();
    }

    /// Like readdir, with each entry looked up for the kernel (saves a LOOKUP per entry for
    /// `ls -l` and friends).
    pub(crate) fn do_readdirplus(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let (handle, entries, start, dir) = match self
            .snapshot(ino, fh, offset)
            .and_then(|(h, e, s)| Ok((h, e, s, self.node(ino)?)))
        {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        let mut stop = entries.len();
        let mut looked_up = 0;
        for (i, e) in entries.iter().enumerate().skip(start) {
            if !self.pruner.listing_may_continue(looked_up) {
                stop = i;
                break;
            }
            let full = match &e.backing {
                // The kernel takes no reference for `.` and `..`.
                None => {
                    let mut attr = negative_attr();
                    attr.ino = INodeNo(e.ino);
                    attr.kind = FileType::Directory;
                    reply.add(
                        INodeNo(e.ino),
                        e.next,
                        &e.name,
                        &Duration::ZERO,
                        &attr,
                        Generation(0),
                    )
                }
                Some(backing) => match if e.plain {
                    self.lookup_plain(&dir, backing, Some(e.kind))
                } else {
                    self.lookup_backing(&dir, backing, &e.name, Some(e.kind))
                } {
                    Ok((inode, attr)) => {
                        looked_up += 1;
                        let ttl = self.coherence.entry_ttl(self.ttl, &attr);
                        let full = reply.add(attr.ino, e.next, &e.name, &ttl, &attr, Generation(0));
                        if full {
                            // Not sent: the kernel never counted this lookup.
                            self.inodes.forget(inode.nodeid, 1);
                        }
                        full
                    }
                    // Gone since the snapshot: leave it out.
                    Err(Errno::ENOENT) => false,
                    // Out of descriptors, say: end this reply here; the kernel asks again
                    // from this entry (by then names have been pruned), or reports the error
                    // if not even one entry could be given.
                    Err(err) if i == start => {
                        Self::stopped_at(&handle, start);
                        return reply.error(err);
                    }
                    Err(_) => true,
                },
            };
            if full {
                stop = i;
                break;
            }
        }
        Self::stopped_at(&handle, stop);
        reply.ok();
    }
}
