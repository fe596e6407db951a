//! FUSE over io_uring (the kernel's Documentation/filesystems/fuse-io-uring.rst, Linux 6.14+):
//! requests and replies pass through per-CPU queues of ring entries instead of a read(2) and
//! a writev(2) of /dev/fuse each.
//!
//! Each serving thread owns one io_uring and one ring entry (a header buffer and a payload
//! buffer the kernel writes requests into and reads replies from) registered on one queue
//! (`FUSE_IO_URING_CMD_REGISTER`). The kernel puts a request on the queue of the CPU that
//! issued it, background requests (RELEASE) too, but the threads are not pinned to their
//! queue's CPU: pinned, a RELEASE was served on the application's CPU before its next request
//! while the other CPU idled (docs/PERFORMANCE.md, What the mount does).
//!
//! The kernel completes the command when it puts a request in the entry; the thread serves it
//! through fuser's request handling and hands the reply back with the next request's fetch in
//! one `io_uring_enter` (`FUSE_IO_URING_CMD_COMMIT_AND_FETCH`). The kernel starts using the
//! rings once every queue has an entry; until then, and for FORGET and INTERRUPT always,
//! requests come through /dev/fuse, whose workers keep running. At unmount the kernel ends
//! every pending command with ENOTCONN, which ends the threads.
//!
//! After a reply the thread may watch its completion queue for a few microseconds before it
//! sleeps ([`Poll`]).
//!
//! A reply's payload has to be in the entry's payload buffer when the command commits. While
//! a request without payload (a READ) is served, that buffer is free: a READ builds its reply
//! there ([`with_reply_buffer`]), and `send` then has nothing to copy.

use fuser::{Dispatcher, Filesystem, ReplyTransport};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::alloc::Layout;
use std::cell::Cell;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

// The kernel's uapi (include/uapi/linux/fuse.h, 7.42).
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: `in_out` (the in or out header), `op_in` (the request's
/// first argument), then `struct fuse_uring_ent_in_out`.
const IN_OUT_OFFSET: usize = 0;
const OP_IN_OFFSET: usize = 128;
const OP_IN_SIZE: usize = 128;
const ENT_IN_OUT_OFFSET: usize = 256;
const REQ_HEADER_SIZE: usize = 256 + 32;
/// `struct fuse_uring_ent_in_out`: flags (u64), commit_id (u64), payload_sz (u32), ...
const COMMIT_ID_OFFSET: usize = ENT_IN_OUT_OFFSET + 8;
const PAYLOAD_SZ_OFFSET: usize = ENT_IN_OUT_OFFSET + 16;
const IN_HEADER_SIZE: usize = 40;
const OUT_HEADER_SIZE: usize = 16;
/// Where the payload starts in an entry's buffer. The request header and first argument are
/// copied to just before it, so fuser sees the request as one contiguous /dev/fuse read
/// without the payload (1 MiB of a write) being copied.
const PAYLOAD_OFFSET: usize = 4096;

/// Requests served through rings by this process, all mounts together.
pub(crate) static SERVED: AtomicU64 = AtomicU64::new(0);

/// How long a serving thread watches for the next request after a reply. An application
/// that makes one request after another (tar, Postmark) makes its next within a few
/// microseconds; one that computes in between (a compiler) makes the poll miss and back off.
pub(crate) const POLL_LIMIT: Duration = Duration::from_micros(30);

/// Whether a serving thread of this process is busy-polling its ring (see [`Poll`]).
static POLLING: AtomicBool = AtomicBool::new(false);

/// Busy polls after a reply by this process, all mounts together, and how many of them saw
/// the next request come.
pub(crate) static POLLS: AtomicU64 = AtomicU64::new(0);
pub(crate) static POLLS_CAUGHT: AtomicU64 = AtomicU64::new(0);

/// Busy-polling for the next request after a reply, instead of sleeping at once.
///
/// The kernel gives a queue's next request to the entry that was last handed back (its list
/// of free entries is a stack), so the thread that just replied is the one to wait for it.
/// Asleep, it is woken by an inter-processor interrupt to a CPU that is often idle, which on
/// a virtual machine means a halted vCPU the host has to run again; polling, it sees the
/// request in its completion queue. Only one thread polls at a time (more would take the
/// CPUs the application needs). A single miss says little (the next request went to another
/// CPU's queue, or came while this thread served another), but a thread that polled in vain
/// three times in a row skips its next 1, 2, 4, ... 64 chances, so a mount whose application
/// computes between its requests (a compiler) does not keep a CPU busy for nothing.
struct Poll {
    limit: Duration,
    misses: u32,
    skip: u32,
}

/// Misses in a row a thread polls through before it backs off.
const GRACE: u32 = 2;

impl Poll {
    fn new(limit: Duration) -> Self {
        Poll {
            limit,
            misses: 0,
            skip: 0,
        }
    }

    /// Submits what is queued (the reply) and waits for the next completion for up to the
    /// limit without sleeping, when it is this thread's turn; `None` otherwise.
    fn next_request(
        &mut self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    ) -> io::Result<Option<cqueue::Entry>> {
        if self.limit.is_zero() {
            return Ok(None);
        }
        if self.skip > 0 {
            self.skip -= 1;
            return Ok(None);
        }
        if POLLING
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Ok(None);
        }
        let polled = (|| {
            match ring.submit() {
                Ok(_) => {}
                // The reply is still queued: the caller's wait submits it.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(None),
                Err(e) => return Err(e),
            }
            let start = Instant::now();
            loop {
                if ring.submission().taskrun() {
                    // The request is queued as task work: entering the kernel runs it, which
                    // posts the completion.
                    match ring.submit() {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                if let Some(c) = ring.completion().next() {
                    return Ok(Some(c));
                }
                if start.elapsed() >= self.limit {
                    return Ok(None);
                }
                std::hint::spin_loop();
            }
        })();
        POLLING.store(false, Ordering::Release);
        POLLS.fetch_add(1, Ordering::Relaxed);
        match polled {
            Ok(Some(_)) => {
                self.misses = 0;
                POLLS_CAUGHT.fetch_add(1, Ordering::Relaxed);
            }
            Ok(None) => {
                self.misses = (self.misses + 1).min(GRACE + 7);
                if self.misses > GRACE {
                    self.skip = 1 << (self.misses - GRACE - 1);
                }
            }
            Err(_) => {}
        }
        polled
    }
}

/// What the serving threads need to know besides the session.
#[derive(Debug, Clone)]
pub(crate) struct UringPlan {
    /// Serving threads (one entry each), spread evenly over the queues.
    pub(crate) threads: usize,
    /// The largest request or reply payload (max_write, at least the kernel's
    /// `max_pages` times the page size).
    pub(crate) payload_size: usize,
    /// Bytes past `payload_size` a READ may need to build its reply in the payload buffer
    /// (the whole blocks around the range read).
    pub(crate) read_slack: usize,
    /// How long a thread busy-polls for the next request after a reply (zero: never).
    pub(crate) poll: Duration,
}

thread_local! {
    /// While a serving thread dispatches a request without payload: its entry's payload
    /// buffer, with the read slack past it.
    static REPLY_BUFFER: Cell<Option<(*mut u8, usize)>> = const { Cell::new(None) };
}

/// Runs `f` with the buffer the current request's reply goes out from, if there is one: on a
/// FUSE over io_uring serving thread, while it serves a request without payload. A reply
/// whose payload is a slice at the start of this buffer is sent without a copy.
pub(crate) fn with_reply_buffer<T>(f: impl FnOnce(Option<&mut [u8]>) -> T) -> T {
    // Taken for the call, so that a nested call cannot make a second reference to it.
    let buffer = REPLY_BUFFER.take();
    // SAFETY: set by `RingEntry::serve` to the entry's payload buffer and slack, which lie in
    // its allocation; while it is set, the kernel does not touch the buffer (it wrote the
    // request before completing the command and reads the reply after the commit) and the
    // request fuser parses lies before it.
    let r = f(buffer.map(|(ptr, len)| unsafe { std::slice::from_raw_parts_mut(ptr, len) }));
    REPLY_BUFFER.set(buffer);
    r
}

/// A serving thread; it ends when the connection does.
pub(crate) type ServingThread = JoinHandle<io::Result<()>>;

/// Whether this process may set up the kind of ring the transport uses (io_uring can be
/// turned off by `kernel.io_uring_disabled`, seccomp or the memlock limit).
pub(crate) fn probe() -> io::Result<()> {
    IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .build(2)
        .map(drop)
}

/// Queues the kernel makes: one per possible CPU.
fn queue_count() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| parse_cpu_list_max(s.trim()))
        .map(|max| max + 1)
        .unwrap_or_else(|| {
            // SAFETY: sysconf has no memory effects.
            let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
            n.max(1) as usize
        })
}

/// The highest CPU number in a list like "0-3,5".
fn parse_cpu_list_max(s: &str) -> Option<usize> {
    s.split(',')
        .map(|part| {
            part.rsplit('-')
                .next()
                .unwrap_or(part)
                .parse::<usize>()
                .ok()
        })
        .try_fold(0usize, |m, n| n.map(|n| m.max(n)))
}

/// Starts the serving threads and registers their entries. Returns the threads (to be
/// joined with the session) and the number of queues with the entries per queue, or, if any
/// entry could not be registered, why: the kernel then keeps every request on /dev/fuse.
pub(crate) fn start<FS: Filesystem + 'static>(
    dispatcher: Dispatcher<FS>,
    plan: &UringPlan,
) -> (Vec<ServingThread>, io::Result<(usize, usize)>) {
    let queues = queue_count();
    let per_queue = plan.threads.div_ceil(queues).max(1);
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for qid in 0..queues {
        for i in 0..per_queue {
            let dispatcher = dispatcher.clone();
            let report = tx.clone();
            let sizes = (plan.payload_size, plan.read_slack);
            let poll_limit = plan.poll;
            let spawned = std::thread::Builder::new()
                .name(format!("fuse-ring-{qid}.{i}"))
                .spawn(move || serve_entry(dispatcher, qid as u16, sizes, poll_limit, report));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        }
    }
    drop(tx);
    let mut failure = None;
    for r in rx {
        if let Err(e) = r {
            failure.get_or_insert(e);
        }
    }
    (threads, failure.map_or(Ok((queues, per_queue)), Err))
}

/// One serving thread: registers its entry on queue `qid`, reports whether that worked on
/// `registered`, then serves until the kernel ends the connection.
fn serve_entry<FS: Filesystem>(
    dispatcher: Dispatcher<FS>,
    qid: u16,
    (payload_size, read_slack): (usize, usize),
    poll_limit: Duration,
    registered: mpsc::Sender<io::Result<()>>,
) -> io::Result<()> {
    let setup = (|| {
        // The kernel delivers a request as task work on this thread. Cooperatively: not by
        // interrupting it (an inter-processor interrupt, and on a virtual machine an exit on
        // the sending vCPU) but when it next enters the kernel, which a sleeping thread does
        // on its wake-up and a polling one when the flag shows work pending ([`Poll`]).
        let ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(2)?;
        let entry = Arc::new(RingEntry::new(payload_size, read_slack)?);
        Ok::<_, io::Error>((ring, entry))
    })();
    let (mut ring, entry) = match setup {
        Ok(s) => s,
        Err(e) => {
            let _ = registered.send(Err(e));
            return Ok(());
        }
    };
    let dev = dispatcher.device().as_raw_fd();
    let iov = [
        libc::iovec {
            iov_base: entry.base.cast(),
            iov_len: REQ_HEADER_SIZE,
        },
        libc::iovec {
            // SAFETY: PAYLOAD_OFFSET + payload_size is within the allocation.
            iov_base: unsafe { entry.base.add(PAYLOAD_OFFSET) }.cast(),
            iov_len: payload_size,
        },
    ];
    let sqe = register_sqe(dev, qid, &iov);
    // SAFETY: the iovecs and the buffers they point to outlive the command: `iov` and
    // `entry` live until this function returns, after the kernel ended every command.
    unsafe { ring.submission().push(&sqe) }.map_err(io::Error::other)?;
    ring.submit()?;
    // Errors in registering come back at once; a registered entry completes only with a
    // request.
    let first = ring.completion().next();
    match first.as_ref().map(|c| c.result()) {
        Some(res) if res < 0 => {
            let _ = registered.send(Err(io::Error::from_raw_os_error(-res)));
            return Ok(());
        }
        _ => {
            let _ = registered.send(Ok(()));
        }
    }
    drop(registered);
    let mut pending = first;
    // The command in flight, resubmitted if the kernel asks for it again (EINTR, EAGAIN).
    let mut in_flight = sqe;
    let mut poll = Poll::new(poll_limit);
    loop {
        let cqe = match pending.take() {
            Some(c) => c,
            None => {
                if let Some(c) = poll.next_request(&mut ring)? {
                    pending = Some(c);
                    continue;
                }
                match ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
                match ring.completion().next() {
                    Some(c) => c,
                    None => continue,
                }
            }
        };
        match cqe.result() {
            0.. => {}
            res if res == -libc::EINTR || res == -libc::EAGAIN => {
                // SAFETY: as for the registration.
                unsafe { ring.submission().push(&in_flight) }.map_err(io::Error::other)?;
                continue;
            }
            // The connection ended (unmount, abort).
            res if res == -libc::ENOTCONN || res == -libc::ENODEV => return Ok(()),
            res => return Err(io::Error::from_raw_os_error(-res)),
        }
        let commit_id = entry.serve(&dispatcher)?;
        SERVED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        in_flight = commit_sqe(dev, qid, commit_id);
        // SAFETY: as for the registration: the entry's buffers outlive the command.
        unsafe { ring.submission().push(&in_flight) }.map_err(io::Error::other)?;
    }
}

fn register_sqe(dev: RawFd, qid: u16, iov: &[libc::iovec; 2]) -> squeue::Entry128 {
    let sqe = opcode::UringCmd80::new(types::Fd(dev), FUSE_IO_URING_CMD_REGISTER)
        .cmd(cmd_req(qid, 0))
        .addr(Some(iov.as_ptr() as u64))
        .build();
    // The kernel also wants the iovec count in the SQE's `len`, which the io-uring crate's
    // UringCmd80 does not set. `len` is the u32 at byte 24 of `struct io_uring_sqe`.
    // SAFETY: Entry128 is repr(C) and 128 bytes (a 64-byte io_uring_sqe and 64 bytes of
    // command data), and any bytes are a valid Entry128.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

fn commit_sqe(dev: RawFd, qid: u16, commit_id: u64) -> squeue::Entry128 {
    opcode::UringCmd80::new(types::Fd(dev), FUSE_IO_URING_CMD_COMMIT_AND_FETCH)
        .cmd(cmd_req(qid, commit_id))
        .build()
}

/// `struct fuse_uring_cmd_req`: flags (u64), commit_id (u64), qid (u16), padding.
fn cmd_req(qid: u16, commit_id: u64) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    cmd
}

/// One ring entry's memory: the request header area at 0, the payload at PAYLOAD_OFFSET,
/// then the read slack (not registered with the kernel). The kernel writes a request there
/// before completing the command and reads the reply after the commit; in between, the
/// serving thread and the reply's sender use it.
#[derive(Debug)]
struct RingEntry {
    base: *mut u8,
    layout: Layout,
    payload_size: usize,
    read_slack: usize,
    reply: Mutex<ReplyState>,
    replied: Condvar,
}

// SAFETY: `base` is owned by the entry (freed in Drop). Its bytes are written only by the
// serving thread between a completion and the next commit, and by the reply's sender, which
// may run on another thread, under `reply`'s mutex and before the serving thread reads the
// reply (it waits on `replied`).
unsafe impl Send for RingEntry {}
// SAFETY: as above.
unsafe impl Sync for RingEntry {}

#[derive(Debug, Default)]
struct ReplyState {
    /// A reply arrived for the current request.
    sent: bool,
    /// The serving thread waits for the reply (it came after dispatch returned).
    waiting: bool,
    /// The reply's payload may go straight into the payload buffer: the request has no
    /// payload there that fuser could still be reading.
    direct: bool,
    /// The reply's payload otherwise (a small reply to a request with a payload).
    side: Vec<u8>,
    payload_len: usize,
}

impl RingEntry {
    fn new(payload_size: usize, read_slack: usize) -> io::Result<Self> {
        let layout = Layout::from_size_align(PAYLOAD_OFFSET + payload_size + read_slack, 4096)
            .map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        Ok(Self {
            base,
            layout,
            payload_size,
            read_slack,
            reply: Mutex::new(ReplyState::default()),
            replied: Condvar::new(),
        })
    }

    fn read_u32(&self, offset: usize) -> u32 {
        let mut b = [0u8; 4];
        // SAFETY: offset + 4 lies in the header area; no reference to it is live.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(offset), b.as_mut_ptr(), 4) };
        u32::from_ne_bytes(b)
    }

    fn read_u64(&self, offset: usize) -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: offset + 8 lies in the header area; no reference to it is live.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(offset), b.as_mut_ptr(), 8) };
        u64::from_ne_bytes(b)
    }

    /// Serves the request the kernel put in this entry and leaves the reply for the commit;
    /// returns the commit id.
    fn serve<FS: Filesystem>(self: &Arc<Self>, dispatcher: &Dispatcher<FS>) -> io::Result<u64> {
        let commit_id = self.read_u64(COMMIT_ID_OFFSET);
        let payload_len = self.read_u32(PAYLOAD_SZ_OFFSET) as usize;
        let total = self.read_u32(IN_OUT_OFFSET) as usize;
        let unique = self.read_u64(IN_OUT_OFFSET + 8);
        // The first argument's size is what the request's length leaves besides the
        // header and the payload.
        let op_len = total
            .checked_sub(IN_HEADER_SIZE + payload_len)
            .filter(|&n| n <= OP_IN_SIZE && payload_len <= self.payload_size);
        {
            let mut state = self.reply.lock().unwrap_or_else(|e| e.into_inner());
            *state = ReplyState {
                direct: payload_len == 0,
                side: std::mem::take(&mut state.side),
                ..ReplyState::default()
            };
            state.side.clear();
        }
        let Some(op_len) = op_len else {
            tracing::error!(
                "FUSE over io_uring: malformed request ({total} bytes, payload {payload_len})"
            );
            self.set_error(unique, libc::EIO);
            return Ok(commit_id);
        };
        let start = PAYLOAD_OFFSET - IN_HEADER_SIZE - op_len;
        // SAFETY: both ranges lie in the allocation (start >= 4096 - 168 > REQ_HEADER_SIZE)
        // and do not overlap; nothing else uses them now.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.add(IN_OUT_OFFSET),
                self.base.add(start),
                IN_HEADER_SIZE,
            );
            std::ptr::copy_nonoverlapping(
                self.base.add(OP_IN_OFFSET),
                self.base.add(start + IN_HEADER_SIZE),
                op_len,
            );
        }
        // SAFETY: the range lies in the allocation and holds the whole request; while the
        // slice lives, only the header area (below `start`) and, when the request has no
        // payload, the payload buffer (from PAYLOAD_OFFSET, past the slice's end) are
        // written, by `send`.
        let request = unsafe { std::slice::from_raw_parts(self.base.add(start), total) };
        let transport: Arc<dyn ReplyTransport> = self.clone();
        if payload_len == 0 {
            // SAFETY: the payload buffer and the slack lie in the allocation.
            let buffer = unsafe { self.base.add(PAYLOAD_OFFSET) };
            REPLY_BUFFER.set(Some((buffer, self.payload_size + self.read_slack)));
        }
        let parsed = dispatcher.dispatch(request, transport);
        REPLY_BUFFER.set(None);
        if !parsed {
            self.set_error(unique, libc::EIO);
            return Ok(commit_id);
        }
        // The reply may come from another thread, after dispatch returned.
        let mut state = self.reply.lock().unwrap_or_else(|e| e.into_inner());
        while !state.sent {
            state.waiting = true;
            state = self.replied.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        if !state.direct {
            // SAFETY: the request slice is gone; the side buffer fits the payload buffer
            // (checked in `send`).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    state.side.as_ptr(),
                    self.base.add(PAYLOAD_OFFSET),
                    state.side.len(),
                )
            };
        }
        self.write_payload_len(state.payload_len);
        Ok(commit_id)
    }

    fn write_payload_len(&self, len: usize) {
        let b = (len as u32).to_ne_bytes();
        // SAFETY: the field lies in the header area, which no reference covers.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.base.add(PAYLOAD_SZ_OFFSET), 4) };
    }

    /// Answers the current request with `errno` and no payload.
    fn set_error(&self, unique: u64, errno: i32) {
        let mut out = [0u8; OUT_HEADER_SIZE];
        out[0..4].copy_from_slice(&(OUT_HEADER_SIZE as u32).to_ne_bytes());
        out[4..8].copy_from_slice(&(-errno).to_ne_bytes());
        out[8..16].copy_from_slice(&unique.to_ne_bytes());
        // SAFETY: the out header lies in the header area, which no reference covers.
        unsafe {
            std::ptr::copy_nonoverlapping(
                out.as_ptr(),
                self.base.add(IN_OUT_OFFSET),
                OUT_HEADER_SIZE,
            )
        };
        self.write_payload_len(0);
    }
}

impl ReplyTransport for RingEntry {
    fn send(&self, bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let mut state = self.reply.lock().unwrap_or_else(|e| e.into_inner());
        if state.sent {
            return Err(io::Error::other("second reply to one request"));
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let payload_len = total.saturating_sub(OUT_HEADER_SIZE);
        if total < OUT_HEADER_SIZE || payload_len > self.payload_size {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // The reply as /dev/fuse takes it: the out header goes to the header area, the rest
        // to the payload.
        let mut at = 0usize;
        for b in bufs {
            let mut src: &[u8] = b;
            while !src.is_empty() {
                if at < OUT_HEADER_SIZE {
                    let n = src.len().min(OUT_HEADER_SIZE - at);
                    // SAFETY: the out header lies in the header area, which no reference
                    // covers.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.add(at), n) };
                    at += n;
                    src = &src[n..];
                } else if state.direct {
                    let off = at - OUT_HEADER_SIZE;
                    // SAFETY: off + len <= payload_size (checked above).
                    let to = unsafe { self.base.add(PAYLOAD_OFFSET + off) };
                    if !std::ptr::eq(src.as_ptr(), to) {
                        // SAFETY: the request has no payload, so no reference covers the
                        // payload buffer but a slice of it from `with_reply_buffer`, which
                        // replies from its start (not copied, above); `copy` allows overlap
                        // all the same.
                        unsafe { std::ptr::copy(src.as_ptr(), to, src.len()) };
                    }
                    at += src.len();
                    src = &[];
                } else {
                    state.side.extend_from_slice(src);
                    at += src.len();
                    src = &[];
                }
            }
        }
        state.payload_len = payload_len;
        state.sent = true;
        // Nearly every reply is sent before dispatch returns: no wake-up (a futex call) then.
        if state.waiting {
            self.replied.notify_one();
        }
        Ok(())
    }
}

impl Drop for RingEntry {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.base, self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list_max("0-1"), Some(1));
        assert_eq!(parse_cpu_list_max("0"), Some(0));
        assert_eq!(parse_cpu_list_max("0-3,5,7-8"), Some(8));
        assert_eq!(parse_cpu_list_max("x"), None);
    }

    #[test]
    fn command_layout() {
        let cmd = cmd_req(3, 0x1122);
        assert_eq!(&cmd[8..16], &0x1122u64.to_ne_bytes());
        assert_eq!(&cmd[16..18], &3u16.to_ne_bytes());
        let iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let sqe = register_sqe(7, 1, &iov);
        // SAFETY: as in register_sqe.
        let raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(raw[0], io_uring::opcode::UringCmd80::CODE);
        assert_eq!(&raw[4..8], &7i32.to_ne_bytes());
        assert_eq!(&raw[16..24], &(iov.as_ptr() as u64).to_ne_bytes());
        assert_eq!(&raw[24..28], &2u32.to_ne_bytes());
    }
}
