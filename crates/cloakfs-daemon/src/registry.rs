//! Attaches, authorizations and active sessions, and every decision about them (NCryptfs
//! 3.3-3.5). Pure state: no threads, no system calls. Time is passed in (`now`, Unix
//! seconds) and facts about callers come through [`Ids`], so tests drive it with a fake
//! clock and fake callers. Side effects the daemon must carry out are returned as
//! [`Event`]s.

use crate::auth;
use crate::perms::Perms;
use crate::protocol::{
    AttachInfo, AuthMethod, AuthzAddRequest, AuthzInfo, Entity, OnTimeout, SessionInfo,
};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use cloakfs_core::crypto::kdf::Argon2Params;
use cloakfs_core::crypto::secret::SecretBytes;
use cloakfs_fuse::tree::{Access, AttachId, Need};
use std::collections::{BTreeMap, BTreeSet};
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

/// Does `entity` describe the caller?
pub fn matches(entity: Entity, ids: &mut dyn Ids) -> bool {
    match entity {
        Entity::Pid(p) => ids.pid() == p || ids.tgid() == Some(p),
        Entity::Session(s) => ids.sid() == Some(s),
        Entity::User(u) => ids.uid() == u,
        Entity::Group(g) => ids.gid() == g || ids.in_group(g),
    }
}

/// A side effect for the daemon to carry out after a registry change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Drop the kernel's caches of this attach.
    Invalidate(AttachId),
    /// Remove the attach from the tree (its keys are wiped).
    Detach(AttachId),
    /// Run a timeout callback `/bin/sh -c cmd sh name reason` as `uid`.
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
    perms: Perms,
    method: Method,
    expires: Option<u64>,
    session_ttl: Option<u64>,
    idle: Option<u64>,
    on_timeout: OnTimeout,
    callback: Option<String>,
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
    uid: u32,
    perms: Perms,
    state: State,
    /// Absolute end of the session's lifetime.
    expires: Option<u64>,
    idle: Option<u64>,
    last_use: u64,
    on_timeout: OnTimeout,
    callback: Option<String>,
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
            if s.live(now) && !p.contains(s.perms) && matches(s.entity, ids) {
                p |= s.perms;
            }
        }
        p
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
        }
    }

    fn usable_authz(&self, id: u32, ids: &mut dyn Ids, now: u64) -> OpResult<&Authz> {
        let z = self
            .authzs
            .get(&id)
            .ok_or_else(|| format!("{} has no authorization {id}", self.name))?;
        if !matches(z.entity, ids) {
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
    fn activate(&mut self, authz: u32, uid: u32, now: u64, next_session: &mut u64) -> u64 {
        let z = &self.authzs[&authz];
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
        s.perms = z.perms;
        s.state = State::Active;
        s.expires = z.session_ttl.map(|t| now.saturating_add(t));
        s.idle = z.idle;
        s.last_use = now;
        s.on_timeout = z.on_timeout;
        s.callback = z.callback.clone().or_else(|| {
            // The owner's session reports to the attach's callback.
            (authz == OWNER_AUTHZ)
                .then(|| self.callback.clone())
                .flatten()
        });
        s.id
    }
}

/// The authorization every attach starts with: the attaching process's session.
pub const OWNER_AUTHZ: u32 = 1;

/// Every attach of the daemon and its access control state.
#[derive(Default)]
pub struct Registry {
    attaches: BTreeMap<AttachId, Attach>,
    /// Names being attached right now (between the check and the tree's answer).
    reserved: BTreeSet<String>,
    next_session: u64,
    /// Requests blocked in the gate right now (all attaches).
    pub waiters: usize,
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

impl Registry {
    pub fn new() -> Self {
        Self {
            next_session: 1,
            ..Default::default()
        }
    }

    fn by_name(&self, name: &str) -> OpResult<&Attach> {
        self.attaches
            .values()
            .find(|a| a.name == name)
            .ok_or_else(|| format!("no attach named {name:?}"))
    }

    fn by_name_mut(&mut self, name: &str) -> OpResult<&mut Attach> {
        self.attaches
            .values_mut()
            .find(|a| a.name == name)
            .ok_or_else(|| format!("no attach named {name:?}"))
    }

    /// The attach called `name`, if any.
    pub fn attach_id(&self, name: &str) -> Option<AttachId> {
        self.by_name(name).ok().map(|a| a.id)
    }

    /// Holds `name` while the tree is asked for it.
    pub fn reserve_name(&mut self, name: &str) -> OpResult<()> {
        if self.reserved.contains(name) || self.attach_id(name).is_some() {
            return Err(format!("name {name} is taken"));
        }
        self.reserved.insert(name.to_string());
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
        let sid = at.activate(OWNER_AUTHZ, a.owner_uid, now, &mut self.next_session);
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
            if s.live(now) && matches(s.entity, ids) {
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
            if !matches(s.entity, ids) {
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
        let a = self.by_name(name)?;
        if a.owner_uid != ids.uid() {
            a.require(ids, now, Perms::DETACH, "detach")?;
        }
        let id = a.id;
        self.attaches.remove(&id);
        Ok(id)
    }

    /// `authz add`: needs add-authz, and grants only permissions the granter holds.
    pub fn authz_add(
        &mut self,
        req: &AuthzAddRequest,
        ids: &mut dyn Ids,
        now: u64,
    ) -> OpResult<u32> {
        let perms = Perms::parse(&req.perms)?;
        let a = self.by_name_mut(&req.name)?;
        a.require(ids, now, Perms::ADD_AUTHZ, "adding an authorization")?;
        let held = a.active_perms(ids, now);
        if !held.contains(perms) {
            return Err(format!(
                "you may only grant permissions you hold on {} ({held})",
                a.name
            ));
        }
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
        if req.callback.as_deref().is_some_and(|c| c.contains('\0')) {
            return Err("callback may not contain NUL".into());
        }
        let id = a.next_authz;
        a.next_authz = a
            .next_authz
            .checked_add(1)
            .ok_or("too many authorizations")?;
        a.authzs.insert(
            id,
            Authz {
                id,
                entity: req.entity,
                perms,
                method,
                expires,
                session_ttl,
                idle,
                on_timeout: req.on_timeout,
                callback: req.callback.clone(),
                granted_by: ids.uid(),
            },
        );
        Ok(id)
    }

    pub fn authz_list(&self, name: &str, ids: &mut dyn Ids, now: u64) -> OpResult<Vec<AuthzInfo>> {
        let a = self.by_name(name)?;
        a.require(ids, now, Perms::LIST_AUTHZ, "listing authorizations")?;
        Ok(a.authzs.values().map(Attach::authz_info).collect())
    }

    /// Deletes an authorization; its sessions stay until they end or are revoked.
    pub fn authz_del(&mut self, name: &str, id: u32, ids: &mut dyn Ids, now: u64) -> OpResult<()> {
        let a = self.by_name_mut(name)?;
        a.require(ids, now, Perms::DEL_AUTHZ, "deleting an authorization")?;
        a.authzs
            .remove(&id)
            .map(|_| ())
            .ok_or_else(|| format!("{name} has no authorization {id}"))
    }

    /// `sessions NAME`: needs list-authz.
    pub fn sessions(&self, name: &str, ids: &mut dyn Ids, now: u64) -> OpResult<Vec<SessionInfo>> {
        let a = self.by_name(name)?;
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
        let a = self.by_name_mut(name)?;
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
        if !a.revoked.contains(&key) {
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
        let next_session = &mut self.next_session;
        let a = self
            .attaches
            .values_mut()
            .find(|a| a.name == name)
            .ok_or_else(|| format!("no attach named {name:?}"))?;
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
            ))),
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
        Ok(a.activate(pending.authz, ids.uid(), now, next_session))
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
                if matches(s.entity, ids) {
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
                if let Some(cmd) = &s.callback {
                    events.push(Event::Callback {
                        uid: s.uid,
                        cmd: cmd.clone(),
                        name: a.name.clone(),
                        reason: reason.into(),
                    });
                }
            }
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
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
