//! The FUSE gate: every request on an attach is decided here, from the registry, before
//! anything is decrypted. Requests under a sleeping timeout block (bounded) until the
//! session is re-authenticated.

use crate::peer::ProcIds;
use crate::registry::Decision;
use crate::shared::{now, Shared};
use cloakfs_fuse::tree::{AttachId, Caller, Gate, Need, Verdict};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct DaemonGate {
    shared: Arc<Shared>,
    max_wait: Duration,
    max_waiters: usize,
}

impl DaemonGate {
    /// `max_waiters` requests at most sleep at once, half of them at most of one uid (the
    /// rest fail at once), each at most `max_wait`.
    pub fn new(shared: Arc<Shared>, max_wait: Duration, max_waiters: usize) -> Self {
        Self {
            shared,
            max_wait,
            max_waiters,
        }
    }
}

impl DaemonGate {
    /// Sleeping requests one uid may have at once: half the pool (at least one), so no user
    /// can fill it and turn another user's sleep into EACCES.
    fn per_uid(&self) -> usize {
        self.max_waiters.div_ceil(2).max(1)
    }
}

impl Gate for DaemonGate {
    fn check(&self, attach: AttachId, caller: &Caller, need: Need) -> Verdict {
        let mut ids = ProcIds::new(caller.uid, caller.gid, caller.pid);
        let deadline = Instant::now() + self.max_wait;
        let mut reg = self.shared.lock();
        let mut waiting_on: Option<u64> = None;
        let verdict = loop {
            match reg.decide(attach, &mut ids, need, now()) {
                Decision::Allow { bypass } => break Verdict::Allow { bypass },
                Decision::Deny => break Verdict::Deny,
                // The daemon is stopping: nobody will re-authenticate.
                Decision::Wait(_) if reg.stopped => break Verdict::Deny,
                Decision::Wait(session) => {
                    if waiting_on != Some(session) {
                        match waiting_on {
                            Some(old) => reg.add_waiting(old, -1),
                            None => {
                                let mine = reg.waiters_by_uid.get(&caller.uid).copied();
                                if reg.waiters >= self.max_waiters
                                    || mine.unwrap_or(0) >= self.per_uid()
                                {
                                    tracing::debug!(attach, "too many sleeping requests: denied");
                                    break Verdict::Deny;
                                }
                                reg.waiters += 1;
                                *reg.waiters_by_uid.entry(caller.uid).or_default() += 1;
                            }
                        }
                        reg.add_waiting(session, 1);
                        waiting_on = Some(session);
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break Verdict::Deny;
                    }
                    reg = self
                        .shared
                        .changed
                        .wait_timeout(reg, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        };
        if let Some(s) = waiting_on {
            reg.add_waiting(s, -1);
            reg.waiters -= 1;
            if let Some(n) = reg.waiters_by_uid.get_mut(&caller.uid) {
                *n -= 1;
                if *n == 0 {
                    reg.waiters_by_uid.remove(&caller.uid);
                }
            }
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::euid;
    use crate::protocol::{AuthMethod, AuthzAddRequest, Entity, OnTimeout};
    use crate::registry::{AuthStart, NewAttach};
    use cloakfs_fuse::tree::Access;

    /// A registry with attach 1 whose only session matching us is timed out with `behaviour`.
    fn timed_out(behaviour: OnTimeout) -> (Arc<Shared>, Caller) {
        let shared = Arc::new(Shared::new());
        let me = Caller {
            uid: euid(),
            gid: rustix::process::getegid().as_raw(),
            pid: std::process::id(),
        };
        let t = now();
        // Under a session leader outside our pid namespace (some CI runners) getsid says 0,
        // and an owner needs a session: then start one (this test process is no group leader).
        if crate::peer::session_of(me.pid).is_none() {
            let _ = rustix::process::setsid(); // a parallel test may have won the race
        }
        let sid = crate::peer::session_of(me.pid).expect("our session");
        let mut owner = ProcIds::new(me.uid, me.gid, me.pid);
        let mut reg = shared.lock();
        reg.insert_attach(
            1,
            NewAttach {
                name: "a".into(),
                path: "/crypt/a".into(),
                cipherdir: "/x".into(),
                owner_uid: me.uid,
                owner_gid: me.gid,
                owner_sid: sid,
                hidden: false,
                read_only: false,
                key_ttl: None,
                callback: None,
            },
            t,
        );
        let id = reg
            .authz_add(
                &AuthzAddRequest {
                    name: "a".into(),
                    entity: Entity::User(me.uid),
                    perms: vec!["read".into()],
                    auth: AuthMethod::None,
                    expires: None,
                    session_ttl: Some(5),
                    idle: None,
                    on_timeout: behaviour,
                    callback: None,
                    any_uid: false,
                },
                &mut owner,
                t,
                None,
            )
            .unwrap();
        assert!(matches!(
            reg.auth_start("a", Some(id), &mut owner, t),
            Ok(AuthStart::Authenticated(_))
        ));
        // The owner's session goes away (as if its leader exited), then the grant's times out.
        reg.process_exited(sid);
        reg.tick(t + 100);
        drop(reg);
        (shared, me)
    }

    fn need(on_open_handle: bool) -> Need {
        Need {
            access: Access::Read,
            on_open_handle,
        }
    }

    #[test]
    fn sleeping_requests_are_bounded() {
        let (shared, me) = timed_out(OnTimeout::SleepAll);
        // No room for sleepers: denied at once.
        let gate = DaemonGate::new(shared.clone(), Duration::from_secs(600), 0);
        assert_eq!(gate.check(1, &me, need(true)), Verdict::Deny);
        // Room, but nobody re-authenticates: denied after the maximum wait.
        let gate = DaemonGate::new(shared.clone(), Duration::from_millis(50), 4);
        let start = Instant::now();
        assert_eq!(gate.check(1, &me, need(false)), Verdict::Deny);
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(shared.lock().waiters, 0);
        // Another attach is not affected.
        assert_eq!(gate.check(3, &me, need(false)), Verdict::Deny);
    }

    #[test]
    fn one_user_cannot_take_every_sleeping_slot() {
        let (shared, me) = timed_out(OnTimeout::SleepAll);
        let gate = DaemonGate::new(shared.clone(), Duration::from_millis(50), 4);
        // Another user sleeps in two of the four slots: we may still sleep (and time out).
        {
            let mut reg = shared.lock();
            reg.waiters = 2;
            reg.waiters_by_uid.insert(me.uid + 1, 2);
        }
        let start = Instant::now();
        assert_eq!(gate.check(1, &me, need(false)), Verdict::Deny);
        assert!(start.elapsed() >= Duration::from_millis(50), "slept");
        // We hold our half already: the next is denied at once, though two slots are free.
        {
            let mut reg = shared.lock();
            reg.waiters_by_uid.remove(&(me.uid + 1));
            reg.waiters_by_uid.insert(me.uid, 2);
        }
        let gate = DaemonGate::new(shared.clone(), Duration::from_secs(600), 4);
        assert_eq!(gate.check(1, &me, need(false)), Verdict::Deny);
        let reg = shared.lock();
        assert_eq!(
            (reg.waiters, reg.waiters_by_uid.get(&me.uid)),
            (2, Some(&2))
        );
    }

    #[test]
    fn fail_new_lets_open_handles_through() {
        let (shared, me) = timed_out(OnTimeout::FailNew);
        let gate = DaemonGate::new(shared, Duration::from_secs(600), 4);
        assert_eq!(
            gate.check(1, &me, need(true)),
            Verdict::Allow { bypass: false }
        );
        assert_eq!(gate.check(1, &me, need(false)), Verdict::Deny);
    }
}
