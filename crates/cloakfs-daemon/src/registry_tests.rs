use super::*;
use crate::protocol::AuthMethod;

const T0: u64 = 1_000_000;
const ATT: AttachId = 7;

/// A fake caller.
#[derive(Clone)]
struct Who {
    uid: u32,
    gid: u32,
    pid: u32,
    tgid: u32,
    sid: u32,
    groups: Vec<u32>,
}

fn who(uid: u32, sid: u32) -> Who {
    Who {
        uid,
        gid: uid,
        pid: sid + 1,
        tgid: sid + 1,
        sid,
        groups: vec![],
    }
}

impl Ids for Who {
    fn uid(&self) -> u32 {
        self.uid
    }
    fn gid(&self) -> u32 {
        self.gid
    }
    fn pid(&self) -> u32 {
        self.pid
    }
    fn tgid(&mut self) -> Option<u32> {
        Some(self.tgid)
    }
    fn sid(&mut self) -> Option<u32> {
        Some(self.sid)
    }
    fn in_group(&mut self, gid: u32) -> bool {
        self.groups.contains(&gid)
    }
}

fn owner() -> Who {
    who(1000, 100)
}

fn setup() -> Registry {
    setup_with(None, None)
}

fn setup_with(key_ttl: Option<u64>, callback: Option<&str>) -> Registry {
    let mut r = Registry::new();
    r.reserve_name("proj").unwrap();
    assert!(r.reserve_name("proj").is_err(), "reserved name is taken");
    let s = r.insert_attach(
        ATT,
        NewAttach {
            name: "proj".into(),
            path: "/crypt/proj".into(),
            cipherdir: "/home/a/enc".into(),
            owner_uid: 1000,
            owner_gid: 1000,
            owner_sid: 100,
            hidden: false,
            read_only: false,
            key_ttl,
            callback: callback.map(str::to_string),
        },
        T0,
    );
    assert_eq!(s, 1);
    r
}

fn need(access: Access) -> Need {
    Need {
        access,
        on_open_handle: false,
    }
}

fn open(access: Access) -> Need {
    Need {
        access,
        on_open_handle: true,
    }
}

fn grant(entity: Entity, perms: &[&str]) -> AuthzAddRequest {
    AuthzAddRequest {
        name: "proj".into(),
        entity,
        perms: perms.iter().map(|p| p.to_string()).collect(),
        auth: AuthMethod::None,
        expires: None,
        session_ttl: None,
        idle: None,
        on_timeout: OnTimeout::FailAll,
        callback: None,
    }
}

fn auth_none(r: &mut Registry, w: &mut Who, now: u64) -> OpResult<u64> {
    match r.auth_start("proj", None, w, now)? {
        AuthStart::Authenticated(s) => Ok(s),
        AuthStart::Challenge { .. } => panic!("unexpected challenge"),
    }
}

const ALLOW: Decision = Decision::Allow { bypass: false };
const ALLOW_BYPASS: Decision = Decision::Allow { bypass: true };

#[test]
fn owner_session_has_every_permission() {
    let mut r = setup();
    let mut o = owner();
    for a in [Access::Look, Access::Read, Access::Write, Access::Exec] {
        assert_eq!(r.decide(ATT, &mut o, need(a), T0), ALLOW_BYPASS);
    }
    assert_eq!(
        r.decide(ATT + 1, &mut o, need(Access::Read), T0),
        Decision::Deny
    );
    let (atts, sess) = r.status(&mut o, T0);
    assert_eq!(atts.len(), 1);
    assert_eq!(atts[0].name, "proj");
    assert_eq!(sess.len(), 1);
    assert_eq!(sess[0].state, "active");
    assert_eq!(sess[0].entity, Entity::Session(100));
    assert_eq!(sess[0].perms.len(), crate::protocol::PERMISSIONS.len());
}

#[test]
fn other_user_and_other_session_denied() {
    let mut r = setup();
    let mut other = who(1001, 200);
    assert_eq!(
        r.decide(ATT, &mut other, need(Access::Look), T0),
        Decision::Deny
    );
    // The owner from another terminal (another session) is not authorized either.
    let mut owner2 = who(1000, 300);
    assert_eq!(
        r.decide(ATT, &mut owner2, need(Access::Read), T0),
        Decision::Deny
    );
    assert!(r.detach("proj", &mut other, T0).is_err());
    assert!(r.auth_start("proj", None, &mut owner2, T0).is_err());
    // status: no attaches of theirs for 1001, the owner's attach for the owner elsewhere.
    let (a, s) = r.status(&mut other, T0);
    assert!(a.is_empty() && s.is_empty());
    let (a, s) = r.status(&mut owner2, T0);
    assert_eq!(a.len(), 1);
    assert!(s.is_empty());
}

#[test]
fn read_only_grant_reads_but_does_not_write() {
    let mut r = setup();
    let id = r
        .authz_add(&grant(Entity::User(1001), &["read"]), &mut owner(), T0)
        .unwrap();
    assert_eq!(id, 2);
    let mut bob = who(1001, 200);
    // Not before authenticating.
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Read), T0),
        Decision::Deny
    );
    let s = auth_none(&mut r, &mut bob, T0).unwrap();
    assert!(s > 1);
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Look), T0), ALLOW);
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0), ALLOW);
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Write), T0),
        Decision::Deny
    );
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Exec), T0),
        Decision::Deny
    );
    // A User session covers every session of that user.
    let mut bob2 = who(1001, 201);
    assert_eq!(r.decide(ATT, &mut bob2, need(Access::Read), T0), ALLOW);
    // Re-authenticating reuses the session.
    assert_eq!(auth_none(&mut r, &mut bob2, T0).unwrap(), s);
    // No management rights.
    assert!(r.authz_list("proj", &mut bob, T0).is_err());
    assert!(r.sessions("proj", &mut bob, T0).is_err());
    assert!(r.detach("proj", &mut bob, T0).is_err());
}

#[test]
fn session_bound_grant_denies_other_sessions_of_same_user() {
    let mut r = setup();
    r.authz_add(
        &grant(Entity::Session(300), &["read", "write"]),
        &mut owner(),
        T0,
    )
    .unwrap();
    let mut in_session = who(1001, 300);
    let mut elsewhere = who(1001, 301);
    assert!(auth_none(&mut r, &mut elsewhere, T0).is_err());
    auth_none(&mut r, &mut in_session, T0).unwrap();
    assert_eq!(
        r.decide(ATT, &mut in_session, need(Access::Write), T0),
        ALLOW
    );
    assert_eq!(
        r.decide(ATT, &mut elsewhere, need(Access::Read), T0),
        Decision::Deny
    );
}

#[test]
fn group_and_pid_entities() {
    let mut r = setup();
    r.authz_add(&grant(Entity::Group(50), &["read"]), &mut owner(), T0)
        .unwrap();
    r.authz_add(&grant(Entity::Pid(4000), &["write"]), &mut owner(), T0)
        .unwrap();
    let mut member = who(1002, 400);
    member.groups = vec![50];
    auth_none(&mut r, &mut member, T0).unwrap();
    let mut other_member = who(1003, 500);
    other_member.gid = 50;
    assert_eq!(
        r.decide(ATT, &mut other_member, need(Access::Read), T0),
        ALLOW
    );
    let mut nonmember = who(1004, 600);
    assert_eq!(
        r.decide(ATT, &mut nonmember, need(Access::Read), T0),
        Decision::Deny
    );

    // A thread of process 4000 (FUSE reports the thread id) matches Pid(4000).
    let mut proc_main = who(1005, 700);
    proc_main.pid = 4000;
    proc_main.tgid = 4000;
    assert_eq!(
        r.auth_start("proj", Some(3), &mut proc_main, T0)
            .map(|_| ()),
        Ok(())
    );
    let mut thread = proc_main.clone();
    thread.pid = 4001;
    assert_eq!(r.decide(ATT, &mut thread, need(Access::Write), T0), ALLOW);
    let mut other_proc = who(1005, 700);
    assert_eq!(
        r.decide(ATT, &mut other_proc, need(Access::Write), T0),
        Decision::Deny
    );

    // The process exits: its authorization and session end, a recycled pid gets nothing.
    let ev = r.process_exited(4000);
    assert_eq!(ev, vec![Event::Invalidate(ATT)]);
    assert_eq!(
        r.decide(ATT, &mut proc_main, need(Access::Write), T0),
        Decision::Deny
    );
    assert!(r.auth_start("proj", Some(3), &mut proc_main, T0).is_err());
    // The owner's session leader exiting ends the owner's session.
    r.process_exited(100);
    assert_eq!(
        r.decide(ATT, &mut owner(), need(Access::Read), T0),
        Decision::Deny
    );
}

#[test]
fn add_authz_grants_only_a_subset_of_what_is_held() {
    let mut r = setup();
    r.authz_add(
        &grant(Entity::User(1001), &["read", "add-authz"]),
        &mut owner(),
        T0,
    )
    .unwrap();
    r.authz_add(
        &grant(Entity::User(1002), &["read", "write"]),
        &mut owner(),
        T0,
    )
    .unwrap();
    let mut bob = who(1001, 200);
    let mut carol = who(1002, 300);
    // Holding the authorization is not enough: an active session is.
    assert!(r
        .authz_add(&grant(Entity::User(1003), &["read"]), &mut bob, T0)
        .is_err());
    auth_none(&mut r, &mut bob, T0).unwrap();
    assert!(r
        .authz_add(&grant(Entity::User(1003), &["read"]), &mut bob, T0)
        .is_ok());
    let e = r
        .authz_add(&grant(Entity::User(1003), &["read", "write"]), &mut bob, T0)
        .unwrap_err();
    assert!(e.contains("only grant"), "{e}");
    assert!(r
        .authz_add(&grant(Entity::User(1003), &["bypass"]), &mut bob, T0)
        .is_err());
    // Without add-authz at all.
    auth_none(&mut r, &mut carol, T0).unwrap();
    assert!(r
        .authz_add(&grant(Entity::User(1003), &["read"]), &mut carol, T0)
        .unwrap_err()
        .contains("add-authz"));
    // Unknown permission names are refused.
    assert!(r
        .authz_add(&grant(Entity::User(1003), &["fly"]), &mut owner(), T0)
        .is_err());
    let list = r.authz_list("proj", &mut owner(), T0).unwrap();
    assert_eq!(list.len(), 4);
    assert_eq!(list[3].granted_by, 1001);
    assert_eq!(list[3].perms, vec!["read".to_string()]);
}

#[test]
fn revoked_session_cannot_reauthenticate() {
    let mut r = setup();
    r.authz_add(&grant(Entity::User(1001), &["read"]), &mut owner(), T0)
        .unwrap();
    let mut bob = who(1001, 200);
    let s = auth_none(&mut r, &mut bob, T0).unwrap();
    // Bob cannot revoke (no permission), the owner can.
    assert!(r.revoke("proj", s, &mut bob, T0).is_err());
    assert_eq!(
        r.revoke("proj", s, &mut owner(), T0).unwrap(),
        vec![Event::Invalidate(ATT)]
    );
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Read), T0),
        Decision::Deny
    );
    let e = auth_none(&mut r, &mut bob, T0).unwrap_err();
    assert!(e.contains("revoked"), "{e}");
    let sess = r.sessions("proj", &mut owner(), T0).unwrap();
    assert_eq!(sess.iter().find(|x| x.id == s).unwrap().state, "revoked");
    assert!(r.revoke("proj", s, &mut owner(), T0).is_err());
    assert!(r.revoke("proj", 999, &mut owner(), T0).is_err());
}

fn timed(on_timeout: OnTimeout) -> (Registry, Who, u64) {
    let mut r = setup();
    let mut g = grant(Entity::User(1001), &["read", "write"]);
    g.session_ttl = Some(10);
    g.on_timeout = on_timeout;
    g.callback = Some("notify-send".into());
    r.authz_add(&g, &mut owner(), T0).unwrap();
    let mut bob = who(1001, 200);
    let s = auth_none(&mut r, &mut bob, T0).unwrap();
    assert_eq!(r.next_deadline(), Some(T0 + 10));
    assert!(r.tick(T0 + 9).is_empty());
    (r, bob, s)
}

#[test]
fn timed_out_session_can_reauthenticate() {
    let (mut r, mut bob, s) = timed(OnTimeout::FailAll);
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0 + 9), ALLOW);
    // Past the deadline the session is refused even before the timer runs.
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Read), T0 + 10),
        Decision::Deny
    );
    let ev = r.tick(T0 + 10);
    assert_eq!(
        ev,
        vec![
            Event::Callback {
                uid: 1001,
                cmd: "notify-send".into(),
                name: "proj".into(),
                reason: "session-expired".into()
            },
            Event::Invalidate(ATT)
        ]
    );
    assert_eq!(r.next_deadline(), None);
    let (_, st) = r.status(&mut bob, T0 + 11);
    assert_eq!(st[0].state, "timed-out");
    assert_eq!(auth_none(&mut r, &mut bob, T0 + 20).unwrap(), s);
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0 + 20), ALLOW);
    assert_eq!(r.next_deadline(), Some(T0 + 30));
}

#[test]
fn on_timeout_behaviours() {
    use Access::Read;
    let cases = [
        (OnTimeout::FailAll, Decision::Deny, Decision::Deny, true),
        (OnTimeout::FailNew, Decision::Deny, ALLOW, false),
        (OnTimeout::SleepNew, Decision::Wait(2), ALLOW, false),
        (
            OnTimeout::SleepAll,
            Decision::Wait(2),
            Decision::Wait(2),
            true,
        ),
    ];
    for (behaviour, new, on_handle, invalidates) in cases {
        let (mut r, mut bob, s) = timed(behaviour);
        assert_eq!(s, 2);
        let ev = r.tick(T0 + 10);
        assert_eq!(
            ev.contains(&Event::Invalidate(ATT)),
            invalidates,
            "{behaviour:?}"
        );
        assert_eq!(
            r.decide(ATT, &mut bob, need(Read), T0 + 11),
            new,
            "{behaviour:?}"
        );
        assert_eq!(
            r.decide(ATT, &mut bob, open(Read), T0 + 11),
            on_handle,
            "{behaviour:?}"
        );
        // Never for another user, and never for what the session could not do anyway.
        let mut eve = who(1009, 900);
        assert_eq!(r.decide(ATT, &mut eve, open(Read), T0 + 11), Decision::Deny);
        assert_eq!(
            r.decide(ATT, &mut bob, open(Access::Exec), T0 + 11),
            Decision::Deny
        );
        // Waiters are counted per session and shown.
        r.add_waiting(s, 1);
        let (_, st) = r.status(&mut bob, T0 + 11);
        assert_eq!(st[0].waiting, 1);
        r.add_waiting(s, -1);
        // Revoked: nothing more, no waiting.
        r.revoke("proj", s, &mut owner(), T0 + 11).unwrap();
        assert_eq!(r.decide(ATT, &mut bob, open(Read), T0 + 11), Decision::Deny);
        assert_eq!(r.decide(ATT, &mut bob, need(Read), T0 + 11), Decision::Deny);
    }
}

#[test]
fn idle_timeout_follows_use() {
    let mut r = setup();
    let mut g = grant(Entity::User(1001), &["read"]);
    g.idle = Some(5);
    r.authz_add(&g, &mut owner(), T0).unwrap();
    let mut bob = who(1001, 200);
    auth_none(&mut r, &mut bob, T0).unwrap();
    assert_eq!(r.next_deadline(), Some(T0 + 5));
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0 + 4), ALLOW);
    assert_eq!(r.next_deadline(), Some(T0 + 9));
    assert!(r.tick(T0 + 5).is_empty());
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0 + 8), ALLOW);
    // A denied request does not count as use.
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Write), T0 + 12),
        Decision::Deny
    );
    assert_eq!(r.tick(T0 + 13), vec![Event::Invalidate(ATT)]);
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Read), T0 + 13),
        Decision::Deny
    );
}

#[test]
fn expired_authorization_refuses_auth_but_keeps_sessions() {
    let mut r = setup();
    let mut g = grant(Entity::User(1001), &["read"]);
    g.expires = Some(60);
    r.authz_add(&g, &mut owner(), T0).unwrap();
    let mut bob = who(1001, 200);
    let mut bob2 = who(1001, 201);
    auth_none(&mut r, &mut bob, T0 + 59).unwrap();
    let e = auth_none(&mut r, &mut bob2, T0 + 60).unwrap_err();
    assert!(e.contains("expired"), "{e}");
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Read), T0 + 1000),
        ALLOW
    );
    // Zero-length timeouts are refused.
    g.expires = Some(0);
    assert!(r.authz_add(&g, &mut owner(), T0).is_err());
}

#[test]
fn deleting_an_authorization_keeps_its_sessions() {
    let mut r = setup();
    let id = r
        .authz_add(&grant(Entity::User(1001), &["read"]), &mut owner(), T0)
        .unwrap();
    let mut bob = who(1001, 200);
    auth_none(&mut r, &mut bob, T0).unwrap();
    assert!(r.authz_del("proj", id, &mut bob, T0).is_err());
    r.authz_del("proj", id, &mut owner(), T0).unwrap();
    assert!(r.authz_del("proj", id, &mut owner(), T0).is_err());
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0), ALLOW);
    assert!(auth_none(&mut r, &mut bob, T0).is_err());
}

fn passphrase_grant(key: &[u8; 32]) -> AuthzAddRequest {
    let mut g = grant(Entity::User(1001), &["read"]);
    g.auth = AuthMethod::Passphrase {
        salt: B64.encode([3u8; 16]),
        memory_kib: 64,
        iterations: 1,
        parallelism: 1,
        key: B64.encode(key),
    };
    g
}

fn challenge(r: &mut Registry, w: &mut Who, c: u8) -> PendingChallenge {
    match r.auth_start("proj", None, w, T0).unwrap() {
        AuthStart::Challenge {
            attach,
            authz,
            salt,
            params,
        } => {
            assert_eq!(salt, vec![3u8; 16]);
            assert_eq!(params.memory_kib, 64);
            PendingChallenge {
                attach,
                name: "proj".into(),
                authz,
                challenge: [c; 32],
            }
        }
        AuthStart::Authenticated(_) => panic!("no challenge"),
    }
}

#[test]
fn passphrase_challenge_response() {
    let key = [42u8; 32];
    let mut r = setup();
    let id = r
        .authz_add(&passphrase_grant(&key), &mut owner(), T0)
        .unwrap();
    let list = r.authz_list("proj", &mut owner(), T0).unwrap();
    assert_eq!(list[1].method, "passphrase");
    let mut bob = who(1001, 200);

    // Forged answer (wrong key) fails, and opens nothing.
    let p = challenge(&mut r, &mut bob, 1);
    let forged = auth::challenge_answer(&[41u8; 32], "proj", id, &p.challenge);
    assert_eq!(
        r.auth_finish(&p, &forged, &mut bob, T0).unwrap_err(),
        "authentication failed"
    );
    assert!(r.auth_finish(&p, b"short", &mut bob, T0).is_err());
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Read), T0),
        Decision::Deny
    );

    // The right answer works.
    let p1 = challenge(&mut r, &mut bob, 1);
    let good = auth::challenge_answer(&key, "proj", id, &p1.challenge);
    let s = r.auth_finish(&p1, &good, &mut bob, T0).unwrap();
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0), ALLOW);

    // Replayed against a fresh challenge, the old answer is worthless.
    assert!(s > 1);
    let mut r = setup();
    r.authz_add(&passphrase_grant(&key), &mut owner(), T0)
        .unwrap();
    let p2 = challenge(&mut r, &mut bob, 2);
    assert!(r.auth_finish(&p2, &good, &mut bob, T0).is_err());
    // Someone else cannot answer a challenge of an authorization that is not theirs.
    let mut eve = who(1009, 900);
    let good2 = auth::challenge_answer(&key, "proj", id, &p2.challenge);
    assert!(r.auth_finish(&p2, &good2, &mut eve, T0).is_err());

    // Bad verifier parameters are refused at grant time.
    let mut g = passphrase_grant(&key);
    if let AuthMethod::Passphrase { key, .. } = &mut g.auth {
        *key = B64.encode([1u8; 31]);
    }
    assert!(r.authz_add(&g, &mut owner(), T0).is_err());
    let mut g = passphrase_grant(&key);
    if let AuthMethod::Passphrase { memory_kib, .. } = &mut g.auth {
        *memory_kib = 1;
    }
    assert!(r.authz_add(&g, &mut owner(), T0).is_err());
}

#[test]
fn key_lifetime_detaches_with_callback() {
    let mut r = setup_with(Some(30), Some("echo $1 $2"));
    assert_eq!(r.next_deadline(), Some(T0 + 30));
    let (a, _) = r.status(&mut owner(), T0);
    assert_eq!(a[0].key_expires, Some(T0 + 30));
    assert!(r.tick(T0 + 29).is_empty());
    let ev = r.tick(T0 + 30);
    assert_eq!(
        ev,
        vec![
            Event::Detach(ATT),
            Event::Callback {
                uid: 1000,
                cmd: "echo $1 $2".into(),
                name: "proj".into(),
                reason: "key-expired".into()
            }
        ]
    );
    assert_eq!(r.attach_id("proj"), None);
    assert_eq!(
        r.decide(ATT, &mut owner(), need(Access::Read), T0),
        Decision::Deny
    );
    assert_eq!(r.next_deadline(), None);
}

#[test]
fn owner_uid_may_always_detach() {
    let mut r = setup();
    // Not the owner's uid, no session: refused.
    assert!(r.detach("proj", &mut who(2000, 300), T0).is_err());
    // The owner from a terminal whose session holds nothing (the attaching one ended).
    assert_eq!(r.detach("proj", &mut who(1000, 301), T0), Ok(ATT));
}

#[test]
fn detach_needs_the_permission_and_frees_the_name() {
    let mut r = setup();
    r.authz_add(
        &grant(Entity::User(2000), &["read", "detach"]),
        &mut owner(),
        T0,
    )
    .unwrap();
    // Another user, once granted and authenticated.
    let mut other = who(2000, 300);
    assert!(r.detach("proj", &mut other, T0).is_err());
    auth_none(&mut r, &mut other, T0).unwrap();
    assert_eq!(r.detach("proj", &mut other, T0), Ok(ATT));
    assert!(r.detach("proj", &mut owner(), T0).is_err());
    assert!(r.reserve_name("proj").is_ok());
}
