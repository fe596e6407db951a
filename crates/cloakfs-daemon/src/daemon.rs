//! The control operations: one [`Request`] from one peer in, one [`Response`] out. Checks
//! who the peer is (never what it claims: its identity was fixed when it connected), checks
//! permission, existence and quotas before opening anything for a request, opens cipher
//! directories as the peer, and keeps secrets out of logs and wiped after use.

use crate::auth::CHALLENGE_LEN;
use crate::limits::Limits;
use crate::naming;
use crate::peer::{as_user, Peer, Process};
use crate::protocol::{
    AttachRequest, AuthMethod, AuthzAddRequest, Entity, MemberKeys, Naming, Request, Response,
};
use crate::refusals::{Refusal, RefusalLog};
use crate::registry::{check_callback, AuthStart, NameTaken, NewAttach, PendingChallenge};
use crate::shared::{dispatch, now, Shared};
use crate::throttle::{Key, Throttle};
use crate::tree::Tree;
use crate::watch::Watcher;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use cloakfs_core::crypto::keys::MasterKey;
use cloakfs_core::format::config::VolumeConfig;
use cloakfs_core::format::filekey::{gpg_fingerprint, Member};
use cloakfs_core::slots::gpg::Keyring;
use cloakfs_core::Volume;
use cloakfs_fuse::tree::AttachSpec;
use rustix::fd::OwnedFd;
use rustix::fs::{Access, AtFlags, OFlags, StatxFlags, CWD};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use zeroize::{Zeroize, Zeroizing};

/// Why an attach from a process whose session the daemon cannot see is refused: the attach
/// ends with its owner's session, so it needs one to watch.
const NO_SESSION: &str = "your process has no Unix session the daemon can see (its session \
    leader is outside the daemon's pid namespace); run the command under `setsid`";

/// The answer on a connection whose process has exited (its pid may belong to another
/// process by now).
pub const PEER_EXITED: &str = "the process that opened this connection has exited: connect again";

/// The state of one control connection.
pub struct Conn {
    /// Who connected, fixed at connect time.
    pub peer: Peer,
    /// The connecting process, held by a pidfd.
    process: Process,
    pending: Option<PendingChallenge>,
}

impl Conn {
    pub fn new(peer: Peer, process: Process) -> Self {
        Self {
            peer,
            process,
            pending: None,
        }
    }

    /// The process that connected has exited: nothing more may be asked in its name.
    pub fn exited(&self) -> bool {
        self.process.exited()
    }
}

/// The daemon's control side over a tree.
pub struct Daemon<T: Tree> {
    shared: Arc<Shared>,
    tree: T,
    root: PathBuf,
    watcher: Watcher,
    throttle: Mutex<Throttle>,
    refusals: RefusalLog,
    limits: Limits,
}

/// How often one user's refusals of one kind are logged (see [`RefusalLog`]).
const REFUSAL_LOG_WINDOW: Duration = Duration::from_secs(60);

fn error(message: impl Into<String>) -> Response {
    Response::Error {
        message: message.into(),
    }
}

fn too_many_failures(wait: Duration) -> String {
    format!(
        "too many failed attempts: try again in {} s",
        wait.as_secs_f64().ceil().max(1.0)
    )
}

/// Hands memory freed by a detach or a deletion back to the system (glibc keeps freed
/// memory of every thread's arena otherwise).
fn return_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions; it only releases free heap pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl<T: Tree> Daemon<T> {
    /// The control side for `tree` mounted at `root`; starts the process watcher. Quotas
    /// are the registry's.
    pub fn new(shared: Arc<Shared>, tree: T, root: PathBuf) -> io::Result<Self> {
        let (s2, t2) = (shared.clone(), tree.clone());
        let watcher = Watcher::start(move |pid| {
            let events = s2.lock().process_exited(pid);
            s2.notify();
            dispatch(&t2, events);
        })?;
        let limits = shared.lock().limits;
        Ok(Self {
            shared,
            tree,
            root,
            watcher,
            throttle: Mutex::new(Throttle::default()),
            refusals: RefusalLog::new(REFUSAL_LOG_WINDOW),
            limits,
        })
    }

    /// Sets the wait after a first failed guess (default two seconds; it doubles with each
    /// further failure).
    pub fn with_penalty(self, first: Duration) -> Self {
        *self.throttle() = Throttle::new(first);
        self
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn throttle(&self) -> MutexGuard<'_, Throttle> {
        self.throttle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches exactly the processes the registry names (under its lock, so that nothing
    /// being added is dropped).
    fn prune_watches(&self) {
        let reg = self.shared.lock();
        self.watcher.retain(&reg.watched_pids());
    }

    /// Processes watched (pidfds held) right now.
    pub fn watched(&self) -> usize {
        self.watcher.len()
    }

    /// Answers one request.
    pub fn handle(&self, conn: &mut Conn, req: Request) -> Response {
        if conn.exited() {
            conn.pending = None;
            return error(PEER_EXITED);
        }
        let peer = conn.peer.clone();
        let mut ids = peer.clone();
        let t = now();
        // Any request but the answer abandons a pending challenge.
        if !matches!(req, Request::AuthAnswer { .. }) {
            conn.pending = None;
        }
        match req {
            Request::Attach(r) => self.attach(&peer, &conn.process, r),
            Request::Status => {
                let (attaches, sessions) = self.shared.lock().status(&mut ids, t);
                Response::Status { attaches, sessions }
            }
            Request::Detach { name } => {
                let r = self.shared.lock().detach(&name, &mut ids, t);
                match r {
                    Ok(id) => {
                        self.shared.notify();
                        tracing::info!(uid = peer.uid, attach = %name, "detached");
                        let r = self.tree.detach(id);
                        self.prune_watches();
                        return_memory();
                        match r {
                            Ok(()) => Response::Ok,
                            Err(e) => error(format!("detaching {name}: {e}")),
                        }
                    }
                    Err(e) => error(e),
                }
            }
            Request::AuthzAdd(r) => self.authz_add(&peer, r),
            Request::AuthzList { name } => {
                match self.shared.lock().authz_list(&name, &mut ids, t) {
                    Ok(authorizations) => Response::Authorizations { authorizations },
                    Err(e) => error(e),
                }
            }
            Request::AuthzDel { name, id } => {
                let r = self.shared.lock().authz_del(&name, id, &mut ids, t);
                match r {
                    Ok(()) => {
                        tracing::info!(uid = peer.uid, attach = %name, authz = id, "authorization deleted");
                        self.prune_watches();
                        return_memory();
                        Response::Ok
                    }
                    Err(e) => error(e),
                }
            }
            Request::Sessions { name } => match self.shared.lock().sessions(&name, &mut ids, t) {
                Ok(sessions) => Response::Sessions { sessions },
                Err(e) => error(e),
            },
            Request::Revoke { name, session } => {
                let r = self.shared.lock().revoke(&name, session, &mut ids, t);
                match r {
                    Ok(events) => {
                        self.shared.notify();
                        tracing::info!(uid = peer.uid, attach = %name, session, "session revoked");
                        dispatch(&self.tree, events);
                        self.prune_watches();
                        Response::Ok
                    }
                    Err(e) => error(e),
                }
            }
            Request::Auth { name, authz } => {
                let r = self.shared.lock().auth_start(&name, authz, &mut ids, t);
                match r {
                    Ok(AuthStart::Authenticated(session)) => {
                        self.shared.notify();
                        tracing::info!(uid = peer.uid, pid = peer.pid, attach = %name, session, "authenticated");
                        Response::Authenticated { session }
                    }
                    Ok(AuthStart::Challenge {
                        attach,
                        authz,
                        salt,
                        params,
                    }) => {
                        // Said now, so nobody types a passphrase only to be refused.
                        let keys = [Key::Authz(attach, authz), Key::Uid(peer.uid)];
                        let wait = self.throttle().wait(&keys, Instant::now());
                        if !wait.is_zero() {
                            if let Some(unlogged) =
                                self.refusals
                                    .admit(peer.uid, Refusal::Challenge, Instant::now())
                            {
                                tracing::warn!(uid = peer.uid, pid = peer.pid, attach = %name, authz, wait_s = wait.as_secs(), unlogged_before = unlogged, "challenge refused: too many failed attempts (logged once a minute per user)");
                            }
                            return error(too_many_failures(wait));
                        }
                        let challenge: [u8; CHALLENGE_LEN] = cloakfs_core::crypto::random::array();
                        conn.pending = Some(PendingChallenge {
                            attach,
                            name,
                            authz,
                            challenge,
                        });
                        Response::Challenge {
                            authz,
                            challenge: B64.encode(challenge),
                            salt: B64.encode(salt),
                            memory_kib: params.memory_kib,
                            iterations: params.iterations,
                            parallelism: params.lanes,
                        }
                    }
                    Err(e) => error(e),
                }
            }
            Request::AuthAnswer { answer } => self.auth_answer(conn, &answer),
        }
    }

    fn auth_answer(&self, conn: &mut Conn, answer: &str) -> Response {
        let Some(pending) = conn.pending.take() else {
            return error("no challenge is pending on this connection (send auth first)");
        };
        let peer = conn.peer.clone();
        // The attempt is booked before the answer is checked: answers sent at once on many
        // connections are refused unchecked.
        let keys = [
            Key::Authz(pending.attach, pending.authz),
            Key::Uid(peer.uid),
        ];
        if let Err(wait) = self.throttle().begin(&keys, Instant::now()) {
            if let Some(unlogged) = self
                .refusals
                .admit(peer.uid, Refusal::Answer, Instant::now())
            {
                tracing::warn!(uid = peer.uid, pid = peer.pid, attach = %pending.name, authz = pending.authz, wait_s = wait.as_secs(), unlogged_before = unlogged, "challenge answer refused unchecked: too many failed attempts (logged once a minute per user)");
            }
            return error(too_many_failures(wait));
        }
        let bytes = Zeroizing::new(B64.decode(answer).unwrap_or_default());
        let mut ids = peer.clone();
        let r = self
            .shared
            .lock()
            .auth_finish(&pending, &bytes, &mut ids, now());
        match r {
            Ok(session) => {
                self.throttle().succeeded(&keys);
                self.shared.notify();
                tracing::info!(uid = peer.uid, pid = peer.pid, attach = %pending.name, session, "authenticated by passphrase");
                Response::Authenticated { session }
            }
            Err(e) => {
                let (for_authz, for_uid, wait) = {
                    let t = self.throttle();
                    let (a, u) = (t.failures(keys[0]), t.failures(keys[1]));
                    (a, u, t.delay(a.max(u)))
                };
                tracing::warn!(uid = peer.uid, pid = peer.pid, attach = %pending.name, authz = pending.authz, failures_of_authz = for_authz, failures_of_uid = for_uid, next_try_in_s = wait.as_secs(), reason = %e, "authentication failed");
                error(e)
            }
        }
    }

    fn authz_add(&self, peer: &Peer, mut r: AuthzAddRequest) -> Response {
        let resp = self.authz_add_inner(peer, &r);
        if let AuthMethod::Passphrase { key, .. } = &mut r.auth {
            key.zeroize();
        }
        resp
    }

    fn authz_add_inner(&self, peer: &Peer, r: &AuthzAddRequest) -> Response {
        let mut ids = peer.clone();
        // Every check first: no process is looked at, nothing is held, for a request that
        // would be refused.
        if let Err(e) = self.shared.lock().check_authz_add(r, &mut ids, now()) {
            return error(e);
        }
        let target = match r.entity {
            Entity::Pid(p) | Entity::Session(p) => match bind_target(r.entity) {
                Ok(t) => Some(t),
                Err(e) => return error(format!("cannot bind an authorization to {p}: {e}")),
            },
            Entity::User(_) | Entity::Group(_) => None,
        };
        let only_uid = match &target {
            Some((_, uid)) if !r.any_uid => Some(*uid),
            _ => None,
        };
        let mut reg = self.shared.lock();
        match reg.authz_add(r, &mut ids, now(), only_uid) {
            Ok(id) => {
                // Under the registry lock: the process exits no earlier than it is watched.
                if let Some((process, _)) = target {
                    self.watcher.watch_process(process);
                }
                drop(reg);
                tracing::info!(uid = peer.uid, attach = %r.name, authz = id, entity = ?r.entity, only_uid = ?only_uid, perms = ?r.perms, "authorization added");
                Response::AuthzAdded { id }
            }
            Err(e) => error(e),
        }
    }

    fn attach(&self, peer: &Peer, caller: &Process, mut r: AttachRequest) -> Response {
        let key = decode_key(&r.master_key);
        r.master_key.zeroize();
        let member = r.member.take().map(|mut m| {
            let made = member_of(peer, &m);
            m.identities.iter_mut().for_each(|t| t.zeroize());
            made
        });
        let (key, member) = match (key, member.transpose()) {
            (Ok(k), Ok(m)) => (k, m),
            (Err(e), _) => return error(e),
            (_, Err(e)) => return error(format!("the member's keys: {e}")),
        };
        match self.attach_with(peer, caller, &r, &key, member) {
            Ok(resp) => resp,
            Err(e) => error(e),
        }
    }

    fn attach_with(
        &self,
        peer: &Peer,
        caller: &Process,
        r: &AttachRequest,
        key: &MasterKey,
        member: Option<Member>,
    ) -> Result<Response, String> {
        let sid = peer.sid.ok_or(NO_SESSION)?;
        if !Path::new(&r.cipherdir).is_absolute() {
            return Err("the cipher directory must be an absolute path".into());
        }
        if let Naming::Given(n) = &r.naming {
            naming::validate_given(n, peer.uid)?;
            // Taking a given name may probe for a hidden attach: not while guessing waits.
            let wait = self.throttle().wait(&[Key::Uid(peer.uid)], Instant::now());
            if !wait.is_zero() {
                return Err(too_many_failures(wait));
            }
        }
        if let Some(c) = &r.callback {
            check_callback(c, self.limits.callback_len)?;
        }
        self.shared.lock().check_attach_quota(peer.uid)?;
        let gid = peer.gid;
        let groups = peer.groups.clone();
        let dir = PathBuf::from(&r.cipherdir);
        let read_only = r.read_only;
        let tree_device = self.tree.device();
        let (fd, config) = as_user(peer.uid, gid, &groups, || {
            open_cipherdir(&dir, read_only, tree_device)
        })
        .map_err(|e| format!("{}: {e}", r.cipherdir))?;
        let mut volume = Volume::from_master_key(config, key)
            .map_err(|e| format!("the key does not open {}: {e}", r.cipherdir))?;
        // Through the attach's descriptor, not the path (which may have changed since).
        let at = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&fd)
        ));
        if let Some(m) = member {
            volume = volume
                .join_as(m)
                .map_err(|e| format!("{}: {e}", r.cipherdir))?;
            volume.keep_retired_ids(&at);
        }
        volume.keep_plaintext_list(&at);
        // Reserve the name, then ask the tree without holding the registry.
        let mut ids = peer.clone();
        let mut tries = 0;
        let name = loop {
            let name = naming::resolve(&r.naming, peer.uid, sid)?;
            let mut throttle = self.throttle();
            let reserved = self.shared.lock().reserve_name(&name, &mut ids);
            match reserved {
                Ok(()) => break name,
                Err(NameTaken::Known | NameTaken::Hidden)
                    if r.naming == Naming::Random && tries < 8 =>
                {
                    tries += 1;
                }
                Err(NameTaken::Hidden) => {
                    // Answered as for any taken name, and counted as a guess.
                    throttle.fail(&[Key::Uid(peer.uid)], Instant::now());
                    if let Some(unlogged) =
                        self.refusals
                            .admit(peer.uid, Refusal::HiddenName, Instant::now())
                    {
                        tracing::warn!(
                            uid = peer.uid,
                            pid = peer.pid,
                            failures_of_uid = throttle.failures(Key::Uid(peer.uid)),
                            unlogged_before = unlogged,
                            "attach refused: its name is held by a hidden attach (counted as a \
                             guess; logged once a minute per user)"
                        );
                    }
                    return Err(NameTaken::Hidden.message(&name));
                }
                Err(e) => return Err(e.message(&name)),
            }
        };
        // Every check passed: only now is a process held. The attach ends with the leader
        // of the owner's session. The caller still in that session afterwards means the
        // session lived all along, so `sid` named it alone and the pidfd is its leader's.
        let leader = session_leader(sid)
            .and_then(|(leader, _)| {
                let still = caller.info().is_ok_and(|i| i.sid == Some(sid));
                if still && !leader.exited() {
                    Ok(leader)
                } else {
                    Err(io::Error::other("your process left its session meanwhile"))
                }
            })
            .map_err(|e| {
                self.shared.lock().unreserve_name(&name);
                format!("your session's leader (pid {sid}) cannot be watched, so the attach could not end with it: {e}")
            })?;
        let spec = AttachSpec {
            name: name.clone(),
            volume,
            cipherdir: fd,
            owner_uid: peer.uid,
            owner_gid: gid,
            owner_groups: groups,
            hidden: r.hidden,
            read_only: r.read_only,
        };
        let id = match self.tree.attach(spec) {
            Ok(id) => id,
            Err(e) => {
                self.shared.lock().unreserve_name(&name);
                return Err(if e.kind() == io::ErrorKind::AlreadyExists {
                    format!("name {name} is taken")
                } else {
                    format!("attaching {name}: {e}")
                });
            }
        };
        let path = self.root.join(&name).display().to_string();
        let session = {
            let mut reg = self.shared.lock();
            let session = reg.insert_attach(
                id,
                NewAttach {
                    name: name.clone(),
                    path: path.clone(),
                    cipherdir: r.cipherdir.clone(),
                    owner_uid: peer.uid,
                    owner_gid: gid,
                    owner_sid: sid,
                    hidden: r.hidden,
                    read_only: r.read_only,
                    key_ttl: r.key_ttl,
                    callback: r.callback.clone(),
                },
                now(),
            );
            self.watcher.watch_process(leader);
            session
        };
        self.shared.notify();
        tracing::info!(uid = peer.uid, pid = peer.pid, sid, attach = %name, cipherdir = %r.cipherdir, hidden = r.hidden, read_only = r.read_only, key_ttl = ?r.key_ttl, "attached");
        Ok(Response::Attached {
            name,
            path,
            session,
        })
    }

    /// Detaches everything (shutdown): keys are wiped.
    pub fn detach_all(&self) {
        let ids = {
            let mut reg = self.shared.lock();
            let ids = reg.attach_ids();
            for id in &ids {
                reg.remove(*id);
            }
            ids
        };
        self.shared.notify();
        for id in ids {
            let _ = self.tree.detach(id);
        }
        self.prune_watches();
    }
}

/// The process a pid or session authorization names, held by a pidfd, and its uid. A
/// session must have a live leader.
fn bind_target(entity: Entity) -> io::Result<(Process, u32)> {
    let (process, info) = match entity {
        Entity::Session(s) => session_leader(s)?,
        Entity::Pid(p) => {
            let process = Process::open(p)?;
            let info = process.info()?;
            (process, info)
        }
        Entity::User(_) | Entity::Group(_) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "users and groups are not processes",
            ))
        }
    };
    Ok((process, info.uid))
}

/// The leader of session `sid`, held by a pidfd, and what /proc says about it.
fn session_leader(sid: u32) -> io::Result<(Process, crate::peer::ProcInfo)> {
    let process = Process::open(sid)?;
    let info = process.info()?;
    if info.sid != Some(sid) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("process {sid} does not lead a Unix session (see `ps -o sid`)"),
        ));
    }
    Ok((process, info))
}

fn decode_key(b64: &str) -> Result<MasterKey, String> {
    let raw = Zeroizing::new(
        B64.decode(b64)
            .map_err(|_| "master key is not base64url".to_string())?,
    );
    let bytes: &[u8; 32] = raw
        .as_slice()
        .try_into()
        .map_err(|_| "master key must be 32 bytes".to_string())?;
    Ok(MasterKey::from_bytes(bytes))
}

/// Runs as the attaching user: opens the cipher directory (O_PATH), refuses one on the
/// daemon's own tree (`tree_device`: serving it would have the tree's workers wait on the
/// tree itself), checks that the user may read and search it (and write it unless
/// read-only), refuses an interrupted rekey, and loads the volume config.
fn open_cipherdir(
    dir: &Path,
    read_only: bool,
    tree_device: Option<(u32, u32)>,
) -> io::Result<(OwnedFd, VolumeConfig)> {
    let fd = rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    // The opened directory's device, not its path: bind mounts, symlinks and /proc paths
    // into the tree all land on the tree's device. DONT_SYNC: the device comes from the
    // kernel's superblock, without asking the file system.
    let st = rustix::fs::statx(
        &fd,
        "",
        AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC,
        StatxFlags::TYPE,
    )?;
    if tree_device == Some((st.stx_dev_major, st.stx_dev_minor)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "lies in the cloakfs daemon's own tree: a cipher directory must be outside it",
        ));
    }
    let mut mode = Access::READ_OK | Access::EXEC_OK;
    if !read_only {
        mode |= Access::WRITE_OK;
    }
    let checked = rustix::fs::accessat(&fd, "", mode, AtFlags::EACCESS | AtFlags::EMPTY_PATH);
    match checked {
        Ok(()) => {}
        // Kernels before 5.8 have no faccessat2: check by path instead.
        Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {
            rustix::fs::accessat(CWD, dir, mode, AtFlags::EACCESS)?
        }
        Err(e) => return Err(e.into()),
    }
    cloakfs_core::tools::rekey::check_not_rekeying(dir).map_err(io::Error::other)?;
    let config = VolumeConfig::load(dir).map_err(io::Error::other)?;
    Ok((fd, config))
}

/// The sharing-volume member an attach opens files as. Its gpg operations (its own entries
/// with `--gpg`, and sealing to gpg recipients) use the attaching user's keyring, run as them.
fn member_of(peer: &Peer, m: &MemberKeys) -> cloakfs_core::Result<Member> {
    let home = crate::peer::user_info(peer.uid)
        .map(|u| u.home)
        .unwrap_or_else(|_| "/".into());
    let keyring = Keyring::of_user(
        peer.uid,
        peer.gid,
        home.into(),
        m.gnupghome.as_ref().map(Into::into),
    );
    if m.identities.is_empty() && m.gpg {
        let own = gpg_fingerprint(&m.recipient);
        return Member::gpg_only(keyring, own);
    }
    let texts: Vec<(String, &[u8])> = (m.identities.iter().enumerate())
        .map(|(i, t)| (format!("#{}", i + 1), t.as_bytes()))
        .collect();
    let member = Member::from_texts(&texts, m.recipient.clone())?.with_keyring(keyring);
    if m.gpg {
        member.with_gpg()
    } else {
        Ok(member)
    }
}
