//! Attaches, authorizations and active sessions, and every decision about them (NCryptfs
//! 3.3-3.5). Pure state: no threads, no system calls. Time is passed in (`now`, Unix
//! seconds) and facts about callers come through [`Ids`], so tests drive it with a fake
//! clock and fake callers. Side effects the daemon must carry out are returned as
//! [`Event`]s.

use crate::auth;
use crate::limits::Limits;
use crate::perms::Perms;
use crate::protocol::{
    AttachInfo, AuthMethod, AuthzAddRequest, AuthzInfo, Entity, OnTimeout, SessionInfo,
};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use cloakfs_core::crypto::kdf::Argon2Params;
use cloakfs_core::crypto::secret::SecretBytes;
use cloakfs_fuse::tree::{Access, AttachId, Need};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use zeroize::Zeroizing;

/// The result of an operation: a message for the client on failure.
pub type OpResult<T> = Result<T, String>;

/// Longest timeout accepted (about 100 years), so deadlines never overflow.
const MAX_SECS: u64 = 100 * 365 * 24 * 3600;

/// Facts about a caller (a FUSE request's sender or a control-socket peer). The expensive
/// ones are computed only when a decision needs them.
pub trait Ids {
    fn uid(&self) -> u32;
    fn gid(&self) -> u32;
    fn pid(&self) -> u32;
    /// The thread group (process) of `pid`, which FUSE reports per thread.
    fn tgid(&mut self) -> Option<u32>;
    /// The Unix session id of the caller.
    fn sid(&mut self) -> Option<u32>;
    /// `gid` is one of the caller's supplementary groups.
    fn in_group(&mut self, gid: u32) -> bool;
}

/// Does `entity`, limited to processes of `only_uid` if given, describe the caller?
pub fn matches(entity: Entity, only_uid: Option<u32>, ids: &mut dyn Ids) -> bool {
    if only_uid.is_some_and(|u| u != ids.uid()) {
        return false;
    }
    match entity {
        Entity::Pid(p) => ids.pid() == p || ids.tgid() == Some(p),
        Entity::Session(s) => ids.sid() == Some(s),
        Entity::User(u) => ids.uid() == u,
        Entity::Group(g) => ids.gid() == g || ids.in_group(g),
    }
}

/// A timeout callback and the user who set it: it only ever runs as that user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callback {
    pub cmd: String,
    pub uid: u32,
}

/// Why a name cannot be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameTaken {
    /// By an attach the caller may know of (or one being attached right now).
    Known,
    /// By a hidden attach the caller is not entitled to know of: the answer must not differ
    /// from [`NameTaken::Known`], but the daemon counts it as a guess.
    Hidden,
    /// The caller owns as many attaches as allowed.
    Quota(usize),
}

impl NameTaken {
    /// The message for the client (the same for a hidden and a known attach).
    pub fn message(&self, name: &str) -> String {
        match self {
            NameTaken::Known | NameTaken::Hidden => format!(
                "name {name} is taken (names that differ only in case, or in 0/O or 1/l/I, \
                 count as one)"
            ),
            NameTaken::Quota(n) => attach_quota_message(*n),
        }
    }
}

fn attach_quota_message(n: usize) -> String {
    format!("you own {n} attaches, the most allowed: detach one first")
}

/// A side effect for the daemon to carry out after a registry change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Drop the kernel's caches of this attach.
    Invalidate(AttachId),
    /// Remove the attach from the tree (its keys are wiped).
    Detach(AttachId),
    /// Run a timeout callback `/bin/sh -c cmd sh name reason` as `uid`, the user who set it.
    Callback {
        uid: u32,
        cmd: String,
        name: String,
        reason: String,
    },
}

/// What a request gets, before any waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow {
        bypass: bool,
    },
    Deny,
    /// Block until this (timed-out) session is re-authenticated or gone.
    Wait(u64),
}

/// Whether the second step of an `auth` is needed.
#[derive(Debug)]
pub enum AuthStart {
    Authenticated(u64),
    Challenge {
        attach: AttachId,
        authz: u32,
        salt: Vec<u8>,
        params: Argon2Params,
    },
}

/// A challenge sent on a connection and not answered yet.
pub struct PendingChallenge {
    pub attach: AttachId,
    pub name: String,
    pub authz: u32,
    pub challenge: [u8; auth::CHALLENGE_LEN],
}

/// A new attach, once the tree has it.
pub struct NewAttach {
    pub name: String,
    pub path: String,
    pub cipherdir: String,
    pub owner_uid: u32,
    pub owner_gid: u32,
    /// Session id of the attaching process: its session becomes the owner's session.
    pub owner_sid: u32,
    pub hidden: bool,
    pub read_only: bool,
    pub key_ttl: Option<u64>,
    pub callback: Option<String>,
}

enum Method {
    None,
    Passphrase {
        salt: Vec<u8>,
        params: Argon2Params,
        key: SecretBytes<32>,
    },
}

struct Authz {
    id: u32,
    entity: Entity,
    /// A pid or session grant covers only processes of this uid (None: any uid).
    only_uid: Option<u32>,
    perms: Perms,
    method: Method,
    expires: Option<u64>,
    session_ttl: Option<u64>,
    idle: Option<u64>,
    on_timeout: OnTimeout,
    callback: Option<Callback>,
    granted_by: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Active,
    TimedOut,
    Revoked,
}

struct Session {
    id: u64,
    authz: u32,
    entity: Entity,
    only_uid: Option<u32>,
    uid: u32,
    perms: Perms,
    state: State,
    /// Absolute end of the session's lifetime.
    expires: Option<u64>,
    idle: Option<u64>,
    last_use: u64,
    on_timeout: OnTimeout,
    callback: Option<Callback>,
    waiting: u32,
}

impl Session {
    fn idle_deadline(&self) -> Option<u64> {
        self.idle.map(|i| self.last_use.saturating_add(i))
    }

    fn deadline(&self) -> Option<u64> {
        match (self.expires, self.idle_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Active and not past a deadline the timer has not processed yet.
    fn live(&self, now: u64) -> bool {
        self.state == State::Active && self.deadline().is_none_or(|d| now < d)
    }

    fn info(&self, attach: &str, now: u64) -> SessionInfo {
        let live = self.live(now);
        SessionInfo {
            id: self.id,
            attach: attach.to_string(),
            authz: self.authz,
            entity: self.entity,
            uid: self.uid,
            state: match (self.state, live) {
                (State::Revoked, _) => "revoked",
                (_, true) => "active",
                _ => "timed-out",
            }
            .to_string(),
            expires: if live { self.deadline() } else { None },
            perms: self.perms.names(),
            waiting: self.waiting,
        }
    }
}

struct Attach {
    id: AttachId,
    name: String,
    path: String,
    cipherdir: String,
    owner_uid: u32,
    hidden: bool,
    read_only: bool,
    key_expires: Option<u64>,
    /// The attach's callback, set by its owner.
    callback: Option<String>,
    authzs: BTreeMap<u32, Authz>,
    next_authz: u32,
    sessions: BTreeMap<u64, Session>,
    /// (authorization, entity) pairs whose session was revoked: never again.
    revoked: Vec<(u32, Entity)>,
}

impl Attach {
    /// Union of the permissions of the live sessions matching the caller.
    fn active_perms(&self, ids: &mut dyn Ids, now: u64) -> Perms {
        let mut p = Perms::NONE;
        for s in self.sessions.values() {
            if s.live(now) && !p.contains(s.perms) && matches(s.entity, s.only_uid, ids) {
                p |= s.perms;
            }
        }
        p
    }

    /// May the caller learn that this attach exists? Everyone may for a listed attach; for
    /// a hidden one, root, its owner's uid, and whoever an authorization or a session of it
    /// names.
    fn known_to(&self, ids: &mut dyn Ids) -> bool {
        if !self.hidden || ids.uid() == 0 || ids.uid() == self.owner_uid {
            return true;
        }
        self.authzs
            .values()
            .any(|z| matches(z.entity, z.only_uid, ids))
            || self
                .sessions
                .values()
                .any(|s| matches(s.entity, s.only_uid, ids))
    }

    fn require(&self, ids: &mut dyn Ids, now: u64, need: Perms, what: &str) -> OpResult<()> {
        if self.active_perms(ids, now).contains(need) {
            Ok(())
        } else {
            Err(format!(
                "permission denied: {what} on {} needs the {need} permission through an active \
                 session (authenticate with `cloakfs auth {}`)",
                self.name, self.name
            ))
        }
    }

    fn authz_info(z: &Authz) -> AuthzInfo {
        AuthzInfo {
            id: z.id,
            entity: z.entity,
            perms: z.perms.names(),
            method: match z.method {
                Method::None => "none",
                Method::Passphrase { .. } => "passphrase",
            }
            .to_string(),
            expires: z.expires,
            session_ttl: z.session_ttl,
            idle: z.idle,
            on_timeout: z.on_timeout,
            granted_by: z.granted_by,
            only_uid: z.only_uid,
        }
    }

    fn usable_authz(&self, id: u32, ids: &mut dyn Ids, now: u64) -> OpResult<&Authz> {
        let z = self
            .authzs
            .get(&id)
            .ok_or_else(|| format!("{} has no authorization {id}", self.name))?;
        if !matches(z.entity, z.only_uid, ids) {
            return Err(format!(
                "authorization {id} of {} is not for you",
                self.name
            ));
        }
        if z.expires.is_some_and(|e| now >= e) {
            return Err(format!(
                "authorization {id} of {} has expired: it admits no new authentications",
                self.name
            ));
        }
        if self.revoked.contains(&(id, z.entity)) {
            return Err(format!(
                "your session under authorization {id} of {} was revoked: it cannot be \
                 re-authenticated",
                self.name
            ));
        }
        Ok(z)
    }

    /// Opens (or re-activates) the session of authorization `authz` for its entity.
    fn activate(
        &mut self,
        authz: u32,
        uid: u32,
        now: u64,
        next_session: &mut u64,
        max_sessions: usize,
    ) -> OpResult<u64> {
        let z = &self.authzs[&authz];
        let found = self
            .sessions
            .values()
            .any(|s| s.authz == authz && s.entity == z.entity && s.state != State::Revoked);
        if !found && self.sessions.len() >= max_sessions {
            return Err(format!(
                "{} holds {max_sessions} sessions, the most allowed: its owner must revoke or \
                 delete some first",
                self.name
            ));
        }
        let existing = self
            .sessions
            .values_mut()
            .find(|s| s.authz == authz && s.entity == z.entity && s.state != State::Revoked);
        let s = match existing {
            Some(s) => s,
            None => {
                let id = *next_session;
                *next_session += 1;
                self.sessions.insert(
                    id,
                    Session {
                        id,
                        authz,
                        entity: z.entity,
                        only_uid: z.only_uid,
                        uid,
                        perms: z.perms,
                        state: State::Active,
                        expires: None,
                        idle: None,
                        last_use: now,
                        on_timeout: z.on_timeout,
                        callback: None,
                        waiting: 0,
                    },
                );
                self.sessions.get_mut(&id).expect("just inserted")
            }
        };
        s.uid = uid;
        s.only_uid = z.only_uid;
        s.perms = z.perms;
        s.state = State::Active;
        s.expires = z.session_ttl.map(|t| now.saturating_add(t));
        s.idle = z.idle;
        s.last_use = now;
        s.on_timeout = z.on_timeout;
        s.callback = z.callback.clone().or_else(|| {
            // The owner's session reports to the attach's callback, run as the owner.
            (authz == OWNER_AUTHZ)
                .then(|| self.callback.clone())
                .flatten()
                .map(|cmd| Callback {
                    cmd,
                    uid: self.owner_uid,
                })
        });
        Ok(s.id)
    }

    /// Drops what can never be used again once authorization `authz` is gone: sessions of
    /// it that are not active (a timed-out one cannot re-authenticate without it, a revoked
    /// one never), and its revocation records (its id is never given out again).
    fn forget_authz(&mut self, authz: u32) {
        self.sessions
            .retain(|_, s| s.authz != authz || s.state == State::Active);
        self.revoked.retain(|(z, _)| *z != authz);
    }
}

/// The authorization every attach starts with: the attaching process's session.
pub const OWNER_AUTHZ: u32 = 1;

/// Every attach of the daemon and its access control state.
#[derive(Default)]
pub struct Registry {
    attaches: BTreeMap<AttachId, Attach>,
    /// Names being attached right now (between the check and the tree's answer), with the
    /// uid attaching.
    reserved: BTreeMap<String, u32>,
    /// Quotas.
    pub limits: Limits,
    next_session: u64,
    /// Requests blocked in the gate right now (all attaches).
    pub waiters: usize,
    /// The same, per uid of the requesting process (only uids with some).
    pub waiters_by_uid: HashMap<u32, usize>,
    /// Set when the daemon shuts down: the timer thread ends.
    pub stopped: bool,
}

fn need_perms(access: Access) -> Perms {
    match access {
        Access::Look => Perms::READ | Perms::WRITE | Perms::EXEC,
        Access::Read => Perms::READ,
        Access::Write => Perms::WRITE,
        Access::Exec => Perms::EXEC,
    }
}

fn satisfies(have: Perms, access: Access) -> bool {
    let want = need_perms(access);
    match access {
        Access::Look => have.intersects(want),
        _ => have.contains(want),
    }
}

fn secs(v: Option<u64>, what: &str) -> OpResult<Option<u64>> {
    match v {
        Some(0) => Err(format!("{what} must be at least 1 second")),
        Some(s) if s > MAX_SECS => Err(format!("{what} is too long")),
        v => Ok(v),
    }
}

fn no_attach(name: &str) -> String {
    format!("no attach named {name:?}")
}

impl Registry {
    pub fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    pub fn with_limits(limits: Limits) -> Self {
        Self {
            next_session: 1,
            limits,
            ..Default::default()
        }
    }

    fn named(&self, name: &str) -> Option<&Attach> {
        self.attaches.values().find(|a| a.name == name)
    }

    /// The attach `name`, answered exactly as for a missing one when it is hidden from the
    /// caller.
    fn by_name(&self, name: &str, ids: &mut dyn Ids) -> OpResult<&Attach> {
        self.named(name)
            .filter(|a| a.known_to(ids))
            .ok_or_else(|| no_attach(name))
    }

    fn by_name_mut(&mut self, name: &str, ids: &mut dyn Ids) -> OpResult<&mut Attach> {
        self.attaches
            .values_mut()
            .find(|a| a.name == name)
            .filter(|a| a.known_to(ids))
            .ok_or_else(|| no_attach(name))
    }

    /// The attach called `name`, if any.
    pub fn attach_id(&self, name: &str) -> Option<AttachId> {
        self.named(name).map(|a| a.id)
    }

    /// Attaches `uid` owns, and is attaching right now.
    fn attaches_of(&self, uid: u32) -> usize {
        self.attaches
            .values()
            .filter(|a| a.owner_uid == uid)
            .count()
            + self.reserved.values().filter(|u| **u == uid).count()
    }

    /// Does `uid` own an attach?
    pub fn owns_attach(&self, uid: u32) -> bool {
        self.attaches.values().any(|a| a.owner_uid == uid)
    }

    /// Refuses a user who owns as many attaches as allowed (checked before anything is
    /// opened for an attach, and again when its name is reserved).
    pub fn check_attach_quota(&self, uid: u32) -> OpResult<()> {
        let n = self.limits.attaches_per_uid;
        if self.attaches_of(uid) >= n {
            return Err(attach_quota_message(n));
        }
        Ok(())
    }

    /// Holds `name` for the caller while the tree is asked for it.
    pub fn reserve_name(&mut self, name: &str, ids: &mut dyn Ids) -> Result<(), NameTaken> {
        let look = crate::naming::skeleton(name);
        if self
            .reserved
            .keys()
            .any(|r| crate::naming::skeleton(r) == look)
        {
            return Err(NameTaken::Known);
        }
        if let Some(a) = self
            .attaches
            .values()
            .find(|a| crate::naming::skeleton(&a.name) == look)
        {
            return Err(if a.known_to(ids) {
                NameTaken::Known
            } else {
                NameTaken::Hidden
            });
        }
        let uid = ids.uid();
        if self.attaches_of(uid) >= self.limits.attaches_per_uid {
            return Err(NameTaken::Quota(self.limits.attaches_per_uid));
        }
        self.reserved.insert(name.to_string(), uid);
        Ok(())
    }

    pub fn unreserve_name(&mut self, name: &str) {
        self.reserved.remove(name);
    }

    /// Records an attach the tree now serves, with the owner's session authorized and active
    /// with every permission. Returns the owner's session id.
    pub fn insert_attach(&mut self, id: AttachId, a: NewAttach, now: u64) -> u64 {
        self.reserved.remove(&a.name);
        let key_expires = a.key_ttl.map(|t| now.saturating_add(t.min(MAX_SECS)));
        let mut at = Attach {
            id,
            name: a.name,
            path: a.path,
            cipherdir: a.cipherdir,
            owner_uid: a.owner_uid,
            hidden: a.hidden,
            read_only: a.read_only,
            key_expires,
            callback: a.callback,
            authzs: BTreeMap::new(),
            next_authz: OWNER_AUTHZ + 1,
            sessions: BTreeMap::new(),
            revoked: Vec::new(),
        };
        at.authzs.insert(
            OWNER_AUTHZ,
            Authz {
                id: OWNER_AUTHZ,
                entity: Entity::Session(a.owner_sid),
                // The owner's processes in that session, not a setuid program run there.
                only_uid: Some(a.owner_uid),
                perms: Perms::ALL,
                method: Method::None,
                expires: None,
                session_ttl: None,
                idle: None,
                on_timeout: OnTimeout::FailAll,
                callback: None,
                granted_by: a.owner_uid,
            },
        );
        let sid = at
            .activate(OWNER_AUTHZ, a.owner_uid, now, &mut self.next_session, 1)
            .expect("a new attach has room for its owner's session");
        self.attaches.insert(id, at);
        sid
    }

    /// The decision for one FUSE request (before any waiting).
    pub fn decide(
        &mut self,
        attach: AttachId,
        ids: &mut dyn Ids,
        need: Need,
        now: u64,
    ) -> Decision {
        let Some(a) = self.attaches.get_mut(&attach) else {
            return Decision::Deny;
        };
        let mut have = Perms::NONE;
        let mut used: Vec<u64> = Vec::new();
        for s in a.sessions.values() {
            if s.live(now) && matches(s.entity, s.only_uid, ids) {
                have |= s.perms;
                used.push(s.id);
            }
        }
        if satisfies(have, need.access) {
            for id in used {
                if let Some(s) = a.sessions.get_mut(&id) {
                    s.last_use = now;
                }
            }
            return Decision::Allow {
                bypass: have.contains(Perms::BYPASS),
            };
        }
        // No live session admits it: a timed-out one decides by its behaviour.
        let mut best = Decision::Deny;
        for s in a.sessions.values() {
            if s.state == State::Revoked || s.live(now) || !satisfies(s.perms, need.access) {
                continue;
            }
            if !matches(s.entity, s.only_uid, ids) {
                continue;
            }
            let bypass = s.perms.contains(Perms::BYPASS);
            let d = match (s.on_timeout, need.on_open_handle) {
                (OnTimeout::FailAll, _) | (OnTimeout::FailNew, false) => Decision::Deny,
                (OnTimeout::FailNew | OnTimeout::SleepNew, true) => Decision::Allow { bypass },
                (OnTimeout::SleepNew, false) | (OnTimeout::SleepAll, _) => Decision::Wait(s.id),
            };
            match (best, d) {
                (_, Decision::Allow { .. }) => return d,
                (Decision::Deny, Decision::Wait(_)) => best = d,
                _ => {}
            }
        }
        best
    }

    /// Counts a request blocked on `session` (delta +1) or no longer blocked (-1).
    pub fn add_waiting(&mut self, session: u64, delta: i32) {
        for a in self.attaches.values_mut() {
            if let Some(s) = a.sessions.get_mut(&session) {
                s.waiting = s.waiting.saturating_add_signed(delta);
                return;
            }
        }
    }

    /// `detach NAME`: needs the detach permission, except for the owner's uid: detaching only
    /// takes access away and wipes the key, which the owner can always supply again, and
    /// without it an attach whose owner session ended would keep its key until the daemon
    /// stops. The attach's state is dropped (verifier keys wiped); the caller removes it
    /// from the tree.
    pub fn detach(&mut self, name: &str, ids: &mut dyn Ids, now: u64) -> OpResult<AttachId> {
        let a = self.by_name(name, ids)?;
        if a.owner_uid != ids.uid() {
            a.require(ids, now, Perms::DETACH, "detach")?;
        }
        let id = a.id;
        self.attaches.remove(&id);
        Ok(id)
    }

    /// Every check of `authz add` (the attach, the permission, the permissions granted, the
    /// parameters, the quotas), without changing anything: the daemon runs it before it
    /// opens anything for the request.
    pub fn check_authz_add(
        &self,
        req: &AuthzAddRequest,
        ids: &mut dyn Ids,
        now: u64,
    ) -> OpResult<()> {
        let a = self.by_name(&req.name, ids)?;
        self.prepare_authz(a, req, ids, now).map(|_| ())
    }

    /// `authz add`: needs add-authz, and grants only permissions the granter holds. A pid or
    /// session grant covers only processes of `only_uid` (the daemon passes the uid of that
    /// process or session leader, or None when the request asks for any uid).
    pub fn authz_add(
        &mut self,
        req: &AuthzAddRequest,
        ids: &mut dyn Ids,
        now: u64,
        only_uid: Option<u32>,
    ) -> OpResult<u32> {
        let a = self.by_name(&req.name, ids)?;
        let mut z = self.prepare_authz(a, req, ids, now)?;
        z.only_uid = match req.entity {
            Entity::Pid(_) | Entity::Session(_) => only_uid,
            Entity::User(_) | Entity::Group(_) => None,
        };
        let a = self.by_name_mut(&req.name, ids)?;
        let id = a.next_authz;
        a.next_authz = a
            .next_authz
            .checked_add(1)
            .ok_or("too many authorizations")?;
        z.id = id;
        a.authzs.insert(id, z);
        Ok(id)
    }

    fn prepare_authz(
        &self,
        a: &Attach,
        req: &AuthzAddRequest,
        ids: &mut dyn Ids,
        now: u64,
    ) -> OpResult<Authz> {
        let perms = Perms::parse(&req.perms)?;
        a.require(ids, now, Perms::ADD_AUTHZ, "adding an authorization")?;
        if req.any_uid && matches!(req.entity, Entity::User(_) | Entity::Group(_)) {
            return Err("--any-uid applies to --pid and --session authorizations only".into());
        }
        let held = a.active_perms(ids, now);
        if !held.contains(perms) {
            return Err(format!(
                "you may only grant permissions you hold on {} ({held})",
                a.name
            ));
        }
        let limits = &self.limits;
        if a.authzs.len() >= limits.authzs_per_attach {
            return Err(format!(
                "{} holds {} authorizations, the most allowed: delete some first",
                a.name, limits.authzs_per_attach
            ));
        }
        let uid = ids.uid();
        let granted: usize = self
            .attaches
            .values()
            .map(|x| x.authzs.values().filter(|z| z.granted_by == uid).count())
            .sum();
        if granted >= limits.authzs_per_uid {
            return Err(format!(
                "you have granted {} authorizations, the most allowed: delete some first",
                limits.authzs_per_uid
            ));
        }
        let callback = match &req.callback {
            None => None,
            Some(c) => {
                check_callback(c, limits.callback_len)?;
                Some(Callback {
                    cmd: c.clone(),
                    uid,
                })
            }
        };
        let expires = secs(req.expires, "--expires")?.map(|e| now.saturating_add(e));
        let session_ttl = secs(req.session_ttl, "--session-ttl")?;
        let idle = secs(req.idle, "--idle")?;
        let method = match &req.auth {
            AuthMethod::None => Method::None,
            AuthMethod::Passphrase {
                salt,
                memory_kib,
                iterations,
                parallelism,
                key,
            } => {
                let params = Argon2Params {
                    memory_kib: *memory_kib,
                    iterations: *iterations,
                    lanes: *parallelism,
                };
                params.validate().map_err(|e| e.to_string())?;
                let salt = B64
                    .decode(salt)
                    .map_err(|_| "passphrase salt is not base64url".to_string())?;
                if !(8..=64).contains(&salt.len()) {
                    return Err("passphrase salt must be 8 to 64 bytes".into());
                }
                let raw = Zeroizing::new(
                    B64.decode(key)
                        .map_err(|_| "passphrase verifier key is not base64url".to_string())?,
                );
                let bytes: &[u8; 32] = raw
                    .as_slice()
                    .try_into()
                    .map_err(|_| "passphrase verifier key must be 32 bytes".to_string())?;
                Method::Passphrase {
                    salt,
                    params,
                    key: SecretBytes::from_slice(bytes),
                }
            }
        };
        Ok(Authz {
            id: 0,
            entity: req.entity,
            only_uid: None,
            perms,
            method,
            expires,
            session_ttl,
            idle,
            on_timeout: req.on_timeout,
            callback,
            granted_by: uid,
        })
    }

    pub fn authz_list(&self, name: &str, ids: &mut dyn Ids, now: u64) -> OpResult<Vec<AuthzInfo>> {
        let a = self.by_name(name, ids)?;
        a.require(ids, now, Perms::LIST_AUTHZ, "listing authorizations")?;
        Ok(a.authzs.values().map(Attach::authz_info).collect())
    }

    /// Deletes an authorization; its active sessions stay until they end or are revoked,
    /// everything else of it goes.
    pub fn authz_del(&mut self, name: &str, id: u32, ids: &mut dyn Ids, now: u64) -> OpResult<()> {
        let a = self.by_name_mut(name, ids)?;
        a.require(ids, now, Perms::DEL_AUTHZ, "deleting an authorization")?;
        a.authzs
            .remove(&id)
            .ok_or_else(|| format!("{name} has no authorization {id}"))?;
        a.forget_authz(id);
        Ok(())
    }

    /// `sessions NAME`: needs list-authz.
    pub fn sessions(&self, name: &str, ids: &mut dyn Ids, now: u64) -> OpResult<Vec<SessionInfo>> {
        let a = self.by_name(name, ids)?;
        a.require(ids, now, Perms::LIST_AUTHZ, "listing sessions")?;
        Ok(a.sessions.values().map(|s| s.info(&a.name, now)).collect())
    }

    /// Ends a session for good: needs revoke.
    pub fn revoke(
        &mut self,
        name: &str,
        session: u64,
        ids: &mut dyn Ids,
        now: u64,
    ) -> OpResult<Vec<Event>> {
        let a = self.by_name_mut(name, ids)?;
        a.require(ids, now, Perms::REVOKE, "revoking a session")?;
        let s = a
            .sessions
            .get_mut(&session)
            .ok_or_else(|| format!("{name} has no session {session}"))?;
        if s.state == State::Revoked {
            return Err(format!("session {session} is already revoked"));
        }
        s.state = State::Revoked;
        let key = (s.authz, s.entity);
        if !a.authzs.contains_key(&key.0) {
            // Its authorization is gone: nothing can bring it back, nothing need remember it.
            a.sessions.remove(&session);
        } else if !a.revoked.contains(&key) {
            a.revoked.push(key);
        }
        Ok(vec![Event::Invalidate(a.id)])
    }

    /// First step of `auth`: picks the authorization (the given one, or the first usable
    /// one matching the caller) and opens the session at once, or asks for a challenge.
    pub fn auth_start(
        &mut self,
        name: &str,
        authz: Option<u32>,
        ids: &mut dyn Ids,
        now: u64,
    ) -> OpResult<AuthStart> {
        let max_sessions = self.limits.sessions_per_attach;
        let next_session = &mut self.next_session;
        let a = self
            .attaches
            .values_mut()
            .find(|a| a.name == name)
            .filter(|a| a.known_to(ids))
            .ok_or_else(|| no_attach(name))?;
        let id = match authz {
            Some(id) => {
                a.usable_authz(id, ids, now)?;
                id
            }
            None => {
                let candidates: Vec<u32> = a.authzs.keys().copied().collect();
                let mut last_err = None;
                let mut found = None;
                for id in candidates {
                    match a.usable_authz(id, ids, now) {
                        Ok(_) => {
                            found = Some(id);
                            break;
                        }
                        Err(e) => {
                            // Prefer explaining an expired or revoked match over "none".
                            if !e.contains("is not for you") {
                                last_err = Some(e);
                            }
                        }
                    }
                }
                found.ok_or_else(|| {
                    last_err.unwrap_or_else(|| format!("no authorization of {name} is for you"))
                })?
            }
        };
        match &a.authzs[&id].method {
            Method::None => Ok(AuthStart::Authenticated(a.activate(
                id,
                ids.uid(),
                now,
                next_session,
                max_sessions,
            )?)),
            Method::Passphrase { salt, params, .. } => Ok(AuthStart::Challenge {
                attach: a.id,
                authz: id,
                salt: salt.clone(),
                params: *params,
            }),
        }
    }

    /// Second step of `auth`: checks the answer to `pending` and opens the session.
    pub fn auth_finish(
        &mut self,
        pending: &PendingChallenge,
        answer: &[u8],
        ids: &mut dyn Ids,
        now: u64,
    ) -> OpResult<u64> {
        let max_sessions = self.limits.sessions_per_attach;
        let next_session = &mut self.next_session;
        let a = self
            .attaches
            .get_mut(&pending.attach)
            .filter(|a| a.name == pending.name)
            .ok_or_else(|| format!("{} was detached", pending.name))?;
        let z = a.usable_authz(pending.authz, ids, now)?;
        let Method::Passphrase { key, .. } = &z.method else {
            return Err("authorization changed during authentication".into());
        };
        if !auth::verify_answer(
            key.expose(),
            &pending.name,
            pending.authz,
            &pending.challenge,
            answer,
        ) {
            return Err("authentication failed".into());
        }
        a.activate(pending.authz, ids.uid(), now, next_session, max_sessions)
    }

    /// `status`: the caller's attaches (root sees all) and the sessions matching the caller.
    pub fn status(&self, ids: &mut dyn Ids, now: u64) -> (Vec<AttachInfo>, Vec<SessionInfo>) {
        let uid = ids.uid();
        let attaches = self
            .attaches
            .values()
            .filter(|a| uid == 0 || a.owner_uid == uid)
            .map(|a| AttachInfo {
                name: a.name.clone(),
                path: a.path.clone(),
                cipherdir: a.cipherdir.clone(),
                owner: a.owner_uid,
                hidden: a.hidden,
                read_only: a.read_only,
                key_expires: a.key_expires,
            })
            .collect();
        let mut sessions = Vec::new();
        for a in self.attaches.values() {
            for s in a.sessions.values() {
                if matches(s.entity, s.only_uid, ids) {
                    sessions.push(s.info(&a.name, now));
                }
            }
        }
        (attaches, sessions)
    }

    /// Processes every deadline up to `now`: key lifetimes end attaches, sessions time out.
    pub fn tick(&mut self, now: u64) -> Vec<Event> {
        let mut events = Vec::new();
        let expired: Vec<AttachId> = self
            .attaches
            .values()
            .filter(|a| a.key_expires.is_some_and(|e| now >= e))
            .map(|a| a.id)
            .collect();
        for id in expired {
            if let Some(a) = self.attaches.remove(&id) {
                tracing::info!(attach = %a.name, "key lifetime ended: detaching");
                events.push(Event::Detach(id));
                if let Some(cmd) = a.callback {
                    // Set by the owner: run as the owner.
                    events.push(Event::Callback {
                        uid: a.owner_uid,
                        cmd,
                        name: a.name,
                        reason: "key-expired".into(),
                    });
                }
            }
        }
        for a in self.attaches.values_mut() {
            let mut invalidate = false;
            for s in a.sessions.values_mut() {
                if s.state != State::Active {
                    continue;
                }
                let reason = if s.expires.is_some_and(|e| now >= e) {
                    "session-expired"
                } else if s.idle_deadline().is_some_and(|e| now >= e) {
                    "idle"
                } else {
                    continue;
                };
                s.state = State::TimedOut;
                tracing::info!(attach = %a.name, session = s.id, reason, "session timed out");
                if matches!(s.on_timeout, OnTimeout::FailAll | OnTimeout::SleepAll) {
                    invalidate = true;
                }
                if let Some(cb) = &s.callback {
                    // As the user who set it, never as the session's user.
                    events.push(Event::Callback {
                        uid: cb.uid,
                        cmd: cb.cmd.clone(),
                        name: a.name.clone(),
                        reason: reason.into(),
                    });
                }
            }
            // A timed-out session whose authorization is gone can never come back.
            let authzs = &a.authzs;
            a.sessions
                .retain(|_, s| s.state == State::Active || authzs.contains_key(&s.authz));
            if invalidate {
                events.push(Event::Invalidate(a.id));
            }
        }
        events
    }

    /// The earliest deadline still to process, if any.
    pub fn next_deadline(&self) -> Option<u64> {
        let mut next: Option<u64> = None;
        let mut consider = |d: Option<u64>| {
            if let Some(d) = d {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        };
        for a in self.attaches.values() {
            consider(a.key_expires);
            for s in a.sessions.values() {
                if s.state == State::Active {
                    consider(s.deadline());
                }
            }
        }
        next
    }

    /// Process `pid` exited: authorizations and sessions bound to it (as a process, or as
    /// the leader of a Unix session) end, so a recycled pid inherits nothing.
    pub fn process_exited(&mut self, pid: u32) -> Vec<Event> {
        let gone = |e: &Entity| matches!(e, Entity::Pid(p) | Entity::Session(p) if *p == pid);
        let mut events = Vec::new();
        for a in self.attaches.values_mut() {
            a.authzs.retain(|_, z| !gone(&z.entity));
            a.revoked.retain(|(_, e)| !gone(e));
            let before = a.sessions.len();
            a.sessions.retain(|_, s| !gone(&s.entity));
            if a.sessions.len() != before {
                tracing::info!(attach = %a.name, pid, "sessions bound to an exited process ended");
                events.push(Event::Invalidate(a.id));
            }
        }
        events
    }

    /// Drops an attach without permission checks (daemon shutdown, tree refusal).
    pub fn remove(&mut self, id: AttachId) {
        self.attaches.remove(&id);
    }

    /// Every attach id (for shutdown).
    pub fn attach_ids(&self) -> Vec<AttachId> {
        self.attaches.keys().copied().collect()
    }

    /// Every process whose exit matters: those pid and session authorizations and sessions
    /// name (the owners' session leaders among them). The daemon watches these and no
    /// others.
    pub fn watched_pids(&self) -> BTreeSet<u32> {
        let mut pids = BTreeSet::new();
        let mut add = |e: &Entity| {
            if let Entity::Pid(p) | Entity::Session(p) = e {
                pids.insert(*p);
            }
        };
        for a in self.attaches.values() {
            a.authzs.values().for_each(|z| add(&z.entity));
            a.sessions.values().for_each(|s| add(&s.entity));
        }
        pids
    }
}

/// A callback command: no NUL, at most `max` bytes.
pub fn check_callback(cmd: &str, max: usize) -> OpResult<()> {
    if cmd.contains('\0') {
        return Err("callback may not contain NUL".into());
    }
    if cmd.len() > max {
        return Err(format!("callback longer than {max} bytes"));
    }
    Ok(())
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
