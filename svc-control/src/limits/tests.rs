//! The caps per guest, their hits, and a guest's end.

use std::time::Duration;

use super::*;

/// Sandbox `id` in a creation of its own.
fn g(id: u32) -> Guest {
    Guest::new(id, format!("{id:016x}"))
}

#[derive(Default)]
struct Seen(Mutex<Vec<(u32, &'static str, u32, bool)>>);

impl Report for Seen {
    fn limit_hit(&self, sandbox: &Guest, limit: Channel, max: u32, log: bool) {
        self.0
            .lock()
            .unwrap()
            .push((sandbox.id, limit.key(), max, log));
    }
}

fn limits(seen: Arc<Seen>) -> Arc<GuestLimits> {
    let config = LimitsConfig {
        dns_tcp_connections: 2,
        exec_streams: 1,
        ..LimitsConfig::default()
    };
    Arc::new(GuestLimits::new(config, seen))
}

#[test]
fn a_sandbox_at_its_cap_is_refused_that_channel_only_and_a_dropped_slot_frees() {
    let seen = Arc::new(Seen::default());
    let l = limits(seen.clone());
    let a = l.acquire(&g(7), Channel::DnsTcp).unwrap();
    let _b = l.acquire(&g(7), Channel::DnsTcp).unwrap();
    let refused = l.acquire(&g(7), Channel::DnsTcp).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "this sandbox already holds 2 DNS-over-TCP connections (limits.dns_tcp_connections): refused"
    );
    // Another channel of the same sandbox, and the same channel of another sandbox.
    let _exec = l.acquire(&g(7), Channel::Exec).unwrap();
    let _other = l.acquire(&g(8), Channel::DnsTcp).unwrap();
    drop(a);
    assert_eq!(l.held(&g(7), Channel::DnsTcp), 1);
    let _c = l.acquire(&g(7), Channel::DnsTcp).unwrap();
    assert_eq!(
        seen.0.lock().unwrap().as_slice(),
        &[(7, "dns_tcp_connections", 2, true)]
    );
}

#[test]
fn hits_are_counted_each_time_and_logged_once_per_interval_per_sandbox_and_limit() {
    let seen = Arc::new(Seen::default());
    let l = limits(seen.clone());
    let _held = (
        l.acquire(&g(1), Channel::Exec),
        l.acquire(&g(2), Channel::Exec),
    );
    for _ in 0..3 {
        let _ = l.acquire(&g(1), Channel::Exec);
    }
    let _ = l.acquire(&g(2), Channel::Exec);
    let logs: Vec<_> = seen.0.lock().unwrap().iter().map(|h| (h.0, h.3)).collect();
    assert_eq!(logs, [(1, true), (1, false), (1, false), (2, true)]);
    // Past the interval, the next hit is logged again.
    let later = Instant::now() + l.config.log_interval;
    assert!(l.first_in_interval(&g(1), Channel::Exec, later));
    assert!(!l.first_in_interval(&g(1), Channel::Exec, later));
}

#[test]
fn every_channel_names_its_own_key() {
    let keys: Vec<_> = [
        Channel::DnsTcp,
        Channel::Proxy,
        Channel::Exec,
        Channel::Spotlight,
        Channel::GitSsh,
    ]
    .map(Channel::key)
    .into();
    assert_eq!(
        keys,
        [
            "dns_tcp_connections",
            "proxy_connections",
            "exec_streams",
            "spotlight_streams",
            "git_ssh_sessions"
        ]
    );
}

#[test]
fn a_later_sandbox_given_the_same_id_holds_its_whole_share_at_once() {
    let l = limits(Arc::new(Seen::default()));
    let earlier = Guest::new(7, "a1a1a1a1a1a1a1a1");
    let later = Guest::new(7, "b2b2b2b2b2b2b2b2");
    let _held = (
        l.acquire(&earlier, Channel::DnsTcp).unwrap(),
        l.acquire(&earlier, Channel::DnsTcp).unwrap(),
    );
    assert!(l.acquire(&earlier, Channel::DnsTcp).is_err());
    // Same id, another creation: its own two.
    let _mine = (
        l.acquire(&later, Channel::DnsTcp).unwrap(),
        l.acquire(&later, Channel::DnsTcp).unwrap(),
    );
    assert!(l.acquire(&later, Channel::DnsTcp).is_err());
    assert_eq!(l.held(&earlier, Channel::DnsTcp), 2);
    assert_eq!(l.held(&later, Channel::DnsTcp), 2);
}

#[tokio::test]
async fn an_ended_guests_slots_are_told_and_drained_waits_until_they_are_given_back() {
    let l = limits(Arc::new(Seen::default()));
    let (gone, next) = (
        Guest::new(3, "a1a1a1a1a1a1a1a1"),
        Guest::new(3, "b2b2b2b2b2b2b2b2"),
    );
    let slot = l.acquire(&gone, Channel::DnsTcp).unwrap();
    let other = l.acquire(&next, Channel::DnsTcp).unwrap();
    // A task serving under the slot until its guest ends.
    let task = tokio::spawn(async move {
        slot.ended().await;
        drop(slot);
    });
    let ending = l.end(&gone);
    assert_eq!(ending.drained(Duration::from_secs(2)).await, Ok(()));
    task.await.unwrap();
    assert_eq!(l.held(&gone, Channel::DnsTcp), 0);
    // The next sandbox given the id is not told.
    let told = tokio::time::timeout(Duration::from_millis(50), other.ended()).await;
    assert!(told.is_err(), "another creation of the id was ended");
    assert_eq!(l.held(&next, Channel::DnsTcp), 1);
}

#[tokio::test]
async fn drained_gives_up_at_its_bound_naming_what_is_still_held() {
    let l = limits(Arc::new(Seen::default()));
    let gone = g(5);
    let _deaf = (
        l.acquire(&gone, Channel::DnsTcp).unwrap(),
        l.acquire(&gone, Channel::Exec).unwrap(),
    );
    let started = std::time::Instant::now();
    let left = l.end(&gone).drained(Duration::from_millis(100)).await;
    assert_eq!(
        left,
        Err(vec![("dns_tcp_connections", 1), ("exec_streams", 1)])
    );
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn a_slot_taken_after_its_guest_ended_is_ended_at_once_and_holding_nothing_drains_at_once() {
    let l = limits(Arc::new(Seen::default()));
    let gone = g(9);
    assert_eq!(l.end(&gone).drained(Duration::from_secs(2)).await, Ok(()));
    let late = l.acquire(&gone, Channel::DnsTcp).unwrap();
    let told = tokio::time::timeout(Duration::from_secs(1), late.ended()).await;
    assert!(told.is_ok(), "a late slot of an ended guest was not told");
    // A guest the caller cannot name (no incarnation) is never taken for an ended one.
    let unknown = Guest::new(9, "");
    l.end(&unknown);
    let slot = l.acquire(&unknown, Channel::DnsTcp).unwrap();
    let told = tokio::time::timeout(Duration::from_millis(50), slot.ended()).await;
    assert!(told.is_err());
}
