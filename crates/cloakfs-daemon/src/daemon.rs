//! The control operations: one [`Request`] from one peer in, one [`Response`] out. Checks
//! who the peer is (never what it claims), opens cipher directories as the peer, and keeps
//! secrets out of logs and wiped after use.

use crate::auth::CHALLENGE_LEN;
use crate::naming;
use crate::peer::{as_user, groups_of, session_of, user_info, Peer, ProcIds};
use crate::protocol::{
    AttachRequest, AuthMethod, AuthzAddRequest, Entity, Naming, Request, Response,
};
use crate::registry::{AuthStart, NewAttach, PendingChallenge};
use crate::shared::{dispatch, now, Shared};
use crate::tree::Tree;
use crate::watch::Watcher;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use cloakfs_core::crypto::keys::MasterKey;
use cloakfs_core::format::config::VolumeConfig;
use cloakfs_core::Volume;
use cloakfs_fuse::tree::AttachSpec;
use rustix::fd::OwnedFd;
use rustix::fs::{Access, AtFlags, OFlags, CWD};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zeroize::{Zeroize, Zeroizing};

/// Why an attach from a process whose session the daemon cannot see is refused: the attach
/// ends with its owner's session, so it needs one to watch.
const NO_SESSION: &str = "your process has no Unix session the daemon can see (its session \
    leader is outside the daemon's pid namespace); run the command under `setsid`";

/// The state of one control connection.
pub struct Conn {
    pub peer: Peer,
    pending: Option<PendingChallenge>,
}

impl Conn {
    pub fn new(peer: Peer) -> Self {
        Self {
            peer,
            pending: None,
        }
    }
}

/// The daemon's control side over a tree.
pub struct Daemon<T: Tree> {
    shared: Arc<Shared>,
    tree: T,
    root: PathBuf,
    watcher: Watcher,
    /// uid -> when that user may next try a challenge answer.
    penalties: Mutex<HashMap<u32, Instant>>,
    penalty: Duration,
}

fn error(message: impl Into<String>) -> Response {
    Response::Error {
        message: message.into(),
    }
}

impl<T: Tree> Daemon<T> {
    /// The control side for `tree` mounted at `root`; starts the process watcher.
    pub fn new(shared: Arc<Shared>, tree: T, root: PathBuf) -> io::Result<Self> {
        let (s2, t2) = (shared.clone(), tree.clone());
        let watcher = Watcher::start(move |pid| {
            let events = s2.lock().process_exited(pid);
            s2.notify();
            dispatch(&t2, events);
        })?;
        Ok(Self {
            shared,
            tree,
            root,
            watcher,
            penalties: Mutex::new(HashMap::new()),
            penalty: Duration::from_secs(1),
        })
    }

    /// Sets the delay after a failed challenge answer (default one second).
    pub fn with_penalty(mut self, penalty: Duration) -> Self {
        self.penalty = penalty;
        self
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Answers one request.
    pub fn handle(&self, conn: &mut Conn, req: Request) -> Response {
        let peer = conn.peer;
        let mut ids = ProcIds::from(peer);
        let t = now();
        // Any request but the answer abandons a pending challenge.
        if !matches!(req, Request::AuthAnswer { .. }) {
            conn.pending = None;
        }
        match req {
            Request::Attach(r) => self.attach(peer, r),
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
                        match self.tree.detach(id) {
                            Ok(()) => Response::Ok,
                            Err(e) => error(format!("detaching {name}: {e}")),
                        }
                    }
                    Err(e) => error(e),
                }
            }
            Request::AuthzAdd(r) => self.authz_add(peer, r),
            Request::AuthzList { name } => {
                match self.shared.lock().authz_list(&name, &mut ids, t) {
                    Ok(authorizations) => Response::Authorizations { authorizations },
                    Err(e) => error(e),
                }
            }
            Request::AuthzDel { name, id } => {
                match self.shared.lock().authz_del(&name, id, &mut ids, t) {
                    Ok(()) => {
                        tracing::info!(uid = peer.uid, attach = %name, authz = id, "authorization deleted");
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
        let peer = conn.peer;
        let wait = {
            let p = self.penalties.lock().unwrap_or_else(|e| e.into_inner());
            p.get(&peer.uid)
                .map(|until| until.saturating_duration_since(Instant::now()))
        };
        if let Some(w) = wait.filter(|w| !w.is_zero()) {
            std::thread::sleep(w);
        }
        let bytes = Zeroizing::new(B64.decode(answer).unwrap_or_default());
        let mut ids = ProcIds::from(peer);
        let r = self
            .shared
            .lock()
            .auth_finish(&pending, &bytes, &mut ids, now());
        match r {
            Ok(session) => {
                self.shared.notify();
                tracing::info!(uid = peer.uid, pid = peer.pid, attach = %pending.name, session, "authenticated by passphrase");
                Response::Authenticated { session }
            }
            Err(e) => {
                tracing::warn!(uid = peer.uid, pid = peer.pid, attach = %pending.name, authz = pending.authz, "authentication failed: {e}");
                let until = Instant::now() + self.penalty;
                self.penalties
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(peer.uid, until);
                std::thread::sleep(self.penalty);
                error(e)
            }
        }
    }

    fn authz_add(&self, peer: Peer, mut r: AuthzAddRequest) -> Response {
        let resp = self.authz_add_inner(peer, &r);
        if let AuthMethod::Passphrase { key, .. } = &mut r.auth {
            key.zeroize();
        }
        resp
    }

    fn authz_add_inner(&self, peer: Peer, r: &AuthzAddRequest) -> Response {
        if let Entity::Pid(p) | Entity::Session(p) = r.entity {
            if let Err(e) = self.watcher.watch(p) {
                return error(format!("cannot bind an authorization to {p}: {e}"));
            }
        }
        let mut ids = ProcIds::from(peer);
        let res = self.shared.lock().authz_add(r, &mut ids, now());
        match res {
            Ok(id) => {
                tracing::info!(uid = peer.uid, attach = %r.name, authz = id, entity = ?r.entity, perms = ?r.perms, "authorization added");
                Response::AuthzAdded { id }
            }
            Err(e) => error(e),
        }
    }

    fn attach(&self, peer: Peer, mut r: AttachRequest) -> Response {
        let key = decode_key(&r.master_key);
        r.master_key.zeroize();
        let key = match key {
            Ok(k) => k,
            Err(e) => return error(e),
        };
        match self.attach_with(peer, &r, &key) {
            Ok(resp) => resp,
            Err(e) => error(e),
        }
    }

    fn attach_with(
        &self,
        peer: Peer,
        r: &AttachRequest,
        key: &MasterKey,
    ) -> Result<Response, String> {
        let sid = session_of(peer.pid).ok_or(NO_SESSION)?;
        if !Path::new(&r.cipherdir).is_absolute() {
            return Err("the cipher directory must be an absolute path".into());
        }
        let user = user_info(peer.uid).ok();
        let gid = peer.gid;
        let groups = groups_of(peer.pid)
            .or_else(|| user.as_ref().map(|u| u.groups.clone()))
            .unwrap_or_default();
        let dir = PathBuf::from(&r.cipherdir);
        let read_only = r.read_only;
        let (fd, config) = as_user(peer.uid, gid, &groups, || open_cipherdir(&dir, read_only))
            .map_err(|e| format!("{}: {e}", r.cipherdir))?;
        let volume = Volume::from_master_key(config, key)
            .map_err(|e| format!("the key does not open {}: {e}", r.cipherdir))?;
        self.watcher.watch(sid).map_err(|e| {
            format!("your session's leader (pid {sid}) cannot be watched, so the attach could not end with it: {e}")
        })?;
        // Reserve the name, then ask the tree without holding the registry.
        let mut tries = 0;
        let name = loop {
            let name = naming::resolve(&r.naming, peer.uid, sid)?;
            match self.shared.lock().reserve_name(&name) {
                Ok(()) => break name,
                Err(e) if r.naming == Naming::Random && tries < 8 => {
                    tries += 1;
                    let _ = e;
                }
                Err(e) => return Err(e),
            }
        };
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
        let session = self.shared.lock().insert_attach(
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
    }
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

/// Runs as the attaching user: opens the cipher directory (O_PATH), checks that the user may
/// read and search it (and write it unless read-only), refuses an interrupted rekey, and
/// loads the volume config.
fn open_cipherdir(dir: &Path, read_only: bool) -> io::Result<(OwnedFd, VolumeConfig)> {
    let fd = rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
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
